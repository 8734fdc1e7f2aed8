"""The format warm start's supervised step: the LM head at the loss tokens only, in micro-batches,
gives the loss and gradients of the whole-logits cross-entropy (as transformers' `labels=` loss
takes it, shifted by one), in float64 to 1e-10."""
import pytest
import torch

from freshper.trainer.train.warm_start import supervised_step


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).double()


def _rows():
    g = torch.Generator().manual_seed(1)
    rows = []
    for n in (9, 14, 6, 11, 14):
        ids = torch.randint(3, 97, (n,), generator=g).tolist()
        labels = [t if i >= n // 2 else -100 for i, t in enumerate(ids)]  # the "replies": the rows' second halves
        rows.append((ids, labels))
    return rows


def _reference(model, rows, pad):
    width = max(len(x) for x, _ in rows)
    ids = torch.full((len(rows), width), pad)
    labels, attn = torch.full_like(ids, -100), torch.zeros_like(ids)
    for r, (x, y) in enumerate(rows):
        ids[r, :len(x)], labels[r, :len(y)], attn[r, :len(x)] = torch.tensor(x), torch.tensor(y), 1
    model.zero_grad()
    logits = model(input_ids=ids, attention_mask=attn).logits  # float64 (the labels= loss rounds to float32)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
    loss.backward()
    return float(loss), {n: p.grad.clone() for n, p in model.named_parameters()}


class _Capture(torch.optim.Optimizer):
    """Keeps the gradients the step was given; changes no weight."""

    def __init__(self, params):
        super().__init__(params, {})
        self.grads = None

    def step(self, closure=None):
        self.grads = [p.grad.clone() for g in self.param_groups for p in g["params"]]


@pytest.mark.parametrize("micro_batch", [0, 2])
def test_the_loss_at_reply_tokens_equals_the_whole_logits_loss(micro_batch):
    model = _model()
    rows = _rows()
    ref_loss, ref_grads = _reference(model, rows, pad=0)
    opt = _Capture(list(model.parameters()))
    loss = supervised_step(model, opt, rows, 0, micro_batch=micro_batch)
    assert loss == pytest.approx(ref_loss, rel=1e-10)
    for (name, _), g in zip(model.named_parameters(), opt.grads):
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-10, atol=1e-12, msg=name)


def test_labels_one_position_off_fail_the_comparison():
    """Taking the loss at the label's own position (no shift) gives another loss: the test above
    would catch it."""
    model = _model()
    rows = _rows()
    ref_loss, _ = _reference(model, rows, pad=0)
    shifted = [(x, y[1:] + [-100]) for x, y in rows]
    loss = supervised_step(model, _Capture(list(model.parameters())), shifted, 0)
    assert abs(loss - ref_loss) > 1e-3


def _tiny(tmp_path, **over):
    from freshper.trainer import config

    return config.load("tiny", None, {"train.iterations": 1, **over})


def test_a_cached_warm_start_gives_the_same_run(tmp_path, monkeypatch, caplog):
    """The second run loads the first's warm-started weights (nothing recomputed) and then runs
    exactly as the first: same losses, same rollout, same update."""
    import logging

    from freshper.trainer.train.loop import Trainer

    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path / "cache"))
    volatile = ("time_", "weight_sync_s")
    runs = []
    for name in ("computed", "loaded"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="freshper"):
            tr = Trainer(_tiny(tmp_path), tmp_path / name)
            rows = tr.run()
        runs.append((tr.sft_losses, [{k: v for k, v in r.items() if not k.startswith(volatile)} for r in rows],
                     "(cached:" in caplog.text))
    (l0, rows0, cached0), (l1, rows1, cached1) = runs
    assert not cached0 and cached1
    assert len(list((tmp_path / "cache" / "warm-start").glob("*.safetensors"))) == 1
    assert l0 == l1 and len(l0) == 60
    assert rows0 == rows1


def test_the_cache_key_holds_what_the_warm_start_depends_on(tmp_path, monkeypatch):
    from freshper.trainer.model.load import load_policy
    from freshper.trainer.train.warm_start import cache_path, settings

    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path / "cache"))
    base = _tiny(tmp_path)
    model, _, folder = load_policy(base, torch.device("cpu"))
    path = cache_path(folder, settings(base, model, 60))
    assert path == cache_path(folder, settings(_tiny(tmp_path), model, 60))
    for over in ({"train.seed": 1}, {"train.sft_lr": 2e-3}, {"env.size": 5}, {"rollout.max_len": 512},
                 {"algo.micro_batch": 2}, {"rollout.max_new_tokens": 12}):
        assert cache_path(folder, settings(_tiny(tmp_path, **over), model, 60)) != path, over
    assert cache_path(folder, settings(base, model, 59)) != path
    assert cache_path(folder, settings(base, model.double(), 60)) != path
    bf16 = _tiny(tmp_path, **{"model.dtype": "bfloat16"})
    bf16_model, _, _ = load_policy(bf16, torch.device("cpu"))  # float32 masters, as `model`: only compute differs
    assert cache_path(folder, settings(bf16, bf16_model, 60)) != path
    assert cache_path(folder, settings(_tiny(tmp_path, **{"train.sft_replies": "solver"}), model, 60)) != path


@pytest.mark.parametrize("replies", ["random", "solver"])
def test_the_warm_start_trains_on_the_replies_it_is_asked_for(tmp_path, monkeypatch, replies):
    """The supervised rows' loss tokens are exactly the chosen source's replies, and only its."""
    import freshper.trainer.train.warm_start as W
    from freshper.trainer.envs import make_env
    from freshper.trainer.model.load import load_policy

    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path / "cache"))
    cfg = _tiny(tmp_path)
    model, tok, _ = load_policy(cfg, torch.device("cpu"))
    given, seen = [], []
    other = {"random": "solver_reply", "solver": "random_reply"}[replies]

    def new_env():
        env = make_env("frozenlake", size=4, max_turns=3)
        chosen = getattr(env, f"{replies}_reply")
        setattr(env, f"{replies}_reply", lambda rng: given.append(chosen(rng)) or given[-1])
        setattr(env, other, lambda rng: pytest.fail(f"{other} was called"))
        return env

    def capture(model, opt, rows, pad_id, vision=None, micro_batch=0):
        for ids, labels in rows:
            seen.extend(tok.decode([t for t in labels if t != -100]).split(tok.eos_token))
        return 0.0

    monkeypatch.setattr(W, "supervised_step", capture)
    W.warm_start(model, tok, new_env, steps=2, lr=1e-3, seed=0, max_words=8, max_len=256, batch=4, replies=replies)
    assert [s for s in seen if s] == given and len(given) >= 8


def test_train_sft_seed_gives_runs_of_other_seeds_one_warm_start(tmp_path, monkeypatch):
    """Runs of seeds 1 and 2 with sft_seed 7 share one cache key (on one model folder) and warm
    start with seed 7; without it each warm starts with its own seed."""
    import freshper.trainer.train.loop as L
    from freshper.trainer.model.load import load_policy
    from freshper.trainer.train.warm_start import cache_path, settings

    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path / "cache"))
    one, two = (_tiny(tmp_path, **{"train.seed": s, "train.sft_seed": 7}) for s in (1, 2))
    model, _, folder = load_policy(one, torch.device("cpu"))
    assert cache_path(folder, settings(one, model, 60)) == cache_path(folder, settings(two, model, 60))
    assert cache_path(folder, settings(one, model, 60)) != cache_path(folder, settings(_tiny(tmp_path), model, 60))
    seeds = []
    monkeypatch.setattr(L, "warm_start", lambda model, tok, mk, steps, lr, seed, *a, **k: seeds.append(seed) or [1.0])
    for over in ({"train.seed": 1, "train.sft_seed": 7}, {"train.seed": 1}):
        L.Trainer(_tiny(tmp_path, **over, **{"train.sft_cache": False}), tmp_path / str(len(seeds)))
    assert seeds == [7, 1]


def test_random_and_pretrained_weights_of_one_folder_never_share_a_warm_start(tmp_path, monkeypatch):
    """Issue 77, defect 1: `--model.init random` and `pretrained` on one model folder start from
    other weights, so their warm starts are cached apart; random weights of other seeds apart too."""
    from freshper.trainer.model.load import load_policy
    from freshper.trainer.train.warm_start import cache_path, settings

    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path / "cache"))
    model, _, folder = load_policy(_tiny(tmp_path), torch.device("cpu"))

    def key(**over):
        cfg = _tiny(tmp_path, **{"model.path": folder, "train.sft_steps": 5, **over})
        return cache_path(folder, settings(cfg, model, 5))

    random0, pretrained = key(**{"model.init": "random"}), key(**{"model.init": "pretrained"})
    assert random0 != pretrained
    assert key(**{"model.init": "random", "train.seed": 1, "train.sft_seed": 0}) != random0
    assert key(**{"model.init": "pretrained", "train.seed": 1, "train.sft_seed": 0}) == pretrained


def test_the_warm_start_ends_an_episode_where_its_step_result_says_done(tmp_path, monkeypatch):
    """Its episodes end at the StepResult's done, not the env's own `.done` (which this env never
    sets): two turns each, and the env is never stepped past its end."""
    import freshper.trainer.train.warm_start as W
    from freshper.trainer.envs import make_env
    from freshper.trainer.model.load import load_policy

    monkeypatch.setenv("FRESHPER_CACHE", str(tmp_path / "cache"))
    model, tok, _ = load_policy(_tiny(tmp_path), torch.device("cpu"))
    turns = []

    def capture(model, opt, rows, pad_id, vision=None, micro_batch=0):
        turns.extend(sum(1 for t in labels if t == tok.eos_token_id) for _, labels in rows)
        return 0.0

    monkeypatch.setattr(W, "supervised_step", capture)
    W.warm_start(model, tok, lambda: make_env("tests.trainer.train.result_only_env:ResultOnly", size=4),
                 steps=1, lr=1e-3, seed=0, max_words=8, max_len=1024, batch=4)
    assert turns == [2, 2, 2, 2]
