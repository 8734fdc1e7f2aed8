"""trainer/model/cache_name.py: the key/value cache goes in and comes out under the installed
transformers' own name, so a release that renamed `past_key_values` to `cache` (5.25) is never
handed the old name. tests/run_newest.sh runs this file on the newest transformers."""
import warnings

import pytest
import torch
import transformers.utils.generic as hf_generic

from freshper.trainer import config
from freshper.trainer.config import env_kwargs
from freshper.trainer.engines.base import Sampling
from freshper.trainer.engines.hf import HFEngine
from freshper.trainer.model.cache_name import cache_kwarg, output_cache
from freshper.trainer.model.load import load_policy
from freshper.trainer.model.prefix import shared_prefix_hidden
from freshper.trainer.train.rollout import rollout

GREEDY = Sampling(0.0, 1.0, 0)


class _New(torch.nn.Module):
    def forward(self, input_ids=None, cache=None, use_cache=None):
        pass


class _Old(torch.nn.Module):
    def forward(self, input_ids=None, past_key_values=None, use_cache=None):
        pass


class _Peft(torch.nn.Module):
    """PEFT's shape: a forward of **kwargs around a model that names its keywords."""
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def get_base_model(self):
        return self.inner

    def forward(self, *args, **kwargs):
        pass


def test_the_keyword_is_the_one_forward_declares():
    assert cache_kwarg(_New()) == "cache"
    assert cache_kwarg(_Old()) == "past_key_values"
    assert cache_kwarg(_Peft(_New())) == "cache"


def test_the_output_field_is_the_one_the_output_has():
    from dataclasses import dataclass

    @dataclass
    class New:
        cache: object = None

    @dataclass
    class Old:
        past_key_values: object = None

    assert output_cache(New(cache="c")) == "c"
    assert output_cache(Old(past_key_values="p")) == "p"


@pytest.fixture(scope="module")
def policy():
    cfg = config.load("tiny", None, {"train.sft_steps": 0, "env.max_turns": 3, "rollout.max_len": 900})
    torch.manual_seed(0)
    model, tok, _ = load_policy(cfg, torch.device("cpu"))
    return cfg, model, tok


def test_the_installed_model_declares_the_chosen_keyword(policy):
    import inspect

    _, model, _ = policy
    name = cache_kwarg(model)
    assert name in inspect.signature(type(model).forward).parameters
    assert name in inspect.signature(type(model.base_model).forward).parameters


def test_no_deprecated_cache_name_reaches_transformers(policy, monkeypatch):
    """A multi-turn rollout (shared first prompts, then the kept cache of later turns) and the
    shared-prefix forward: transformers warns of no renamed keyword or output field. Its
    renames log through hf_generic.logger.warning_once (recorded here, as once-per-process
    logging would hide a second offence) and generate's through warnings.warn."""
    cfg, model, tok = policy
    logged = []
    monkeypatch.setattr(hf_generic.logger, "warning_once", lambda msg, *a, **k: logged.append(str(msg)),
                        raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = HFEngine(model, tok)
        ep = rollout(engine, tok, "frozenlake", env_kwargs(cfg), [11, 12], 2, 10, cfg.rollout.max_len, GREEDY)
        assert int(ep.turns.max()) >= 2, "the test needs a later turn on the kept cache"
        tokens = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 10, 11]])
        shared_prefix_hidden(model.base_model, tokens, torch.tensor([5, 5]), torch.tensor([3, 3]))
    said = logged + [str(w.message) for w in caught]
    assert not [m for m in said if "past_key_values" in m or "cache_params" in m], said
