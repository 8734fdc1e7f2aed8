"""LoRA (model.lora_rank): the update trains only the adapters, the merged weights compute what
the adapted model computes, checkpoints keep the adapters alone and resume, export and vLLM get
the merged weights with the trainer's log-probs."""
import os

import pytest
import torch
from safetensors import safe_open

from freshper.trainer import config
from freshper.trainer.engines.base import Sampling
from freshper.trainer.model.load import load_policy
from freshper.trainer.model.lora import adapter_state, has_lora, merged_state_dict
from freshper.trainer.model.policy import Policy
from freshper.trainer.train.export import export
from freshper.trainer.train.loop import Trainer
from freshper.trainer.train.rollout import rollout

FULL = Sampling(1.0, 1.0, 0)
LORA = {"model.lora_rank": 4, "model.lora_alpha": 8.0, "train.sft_steps": 0}


def perturb_adapters(model, seed: int = 0, scale: float = 0.3) -> None:
    """Adapters far from their start (B = 0), so that merging them matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def logprobs_of(model, tokens):
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.double()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, tokens[:, 1:, None])[..., 0]


def test_the_merged_weights_compute_what_the_adapted_model_computes():
    cfg = config.load("tiny", None, LORA)
    adapted, _, _ = load_policy(cfg, torch.device("cpu"))
    assert has_lora(adapted)
    perturb_adapters(adapted)
    plain, _, _ = load_policy(config.load("tiny", None, {"train.sft_steps": 0}), torch.device("cpu"))
    tokens = torch.randint(0, plain.config.vocab_size, (3, 40), generator=torch.Generator().manual_seed(0))
    want = logprobs_of(adapted, tokens)
    base = logprobs_of(plain, tokens)
    merged = merged_state_dict(adapted)
    assert set(merged) == set(plain.state_dict())  # the base model's names, no adapter tensors
    plain.load_state_dict(merged)
    got = logprobs_of(plain, tokens)
    # Float32 both ways: W x + s B (A x) against (W + s B A) x differ by rounding alone (measured
    # 1.1e-6 here); the adapters themselves move these log-probs by over 0.1, and a wrong
    # scale or a skipped layer moves them by about as much.
    assert float((want - base).abs().max()) > 0.1
    torch.testing.assert_close(got, want, atol=5e-5, rtol=0)


def test_a_lora_update_trains_only_the_adapters_and_follows_the_advantage():
    cfg = config.load("tiny", None, {**LORA, "algo.lr": 1e-2, "algo.warmup_steps": 0})
    torch.manual_seed(0)
    model, tok, _ = load_policy(cfg, torch.device("cpu"))
    from freshper.trainer.config import env_kwargs
    from freshper.trainer.engines.hf import HFEngine

    ep = rollout(HFEngine(model, tok), tok, "frozenlake", env_kwargs(cfg), [3, 4, 5, 6], 2,
                 cfg.rollout.max_new_tokens, cfg.rollout.max_len, FULL)
    policy = Policy(model, cfg, torch.device("cpu"))
    held = {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" not in n}
    adapters = sum(p.numel() for p in adapter_state(model).values())
    assert sum(p.numel() for g in policy.opt.param_groups for p in g["params"]) == adapters
    old = policy.logprobs(ep.tokens, ep.mask)
    adv = ep.mask.float()  # every response token advantage +1: their log-probs must rise
    st = policy.update(ep.tokens, ep.mask, old, adv)
    assert st["grad_norm"] > 0
    new = policy.logprobs(ep.tokens, ep.mask)
    assert float((new - old)[ep.mask].sum()) > 0
    assert all(torch.equal(p, held[n]) for n, p in model.named_parameters() if ".lora_" not in n)
    b = [p for n, p in model.named_parameters() if ".lora_B." in n]
    assert all(float(p.abs().max()) > 0 for p in b), "every B starts at 0 and moves"


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("lora") / "run"
    # the format warm start trains the adapters too (the tiny model's first batches can all score
    # alike, so their advantages are 0): they end well past export's tolerance from the base
    cfg = config.load("tiny", None, {**LORA, "train.iterations": 2, "algo.mode": "per", "train.sft_steps": 5})
    tr = Trainer(cfg, run)
    tr.run()
    return tr, run, cfg


def test_a_lora_checkpoint_holds_the_adapters_and_resumes(lora_run):
    tr, run, cfg = lora_run
    weights = run / "checkpoints" / "iter_000002" / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        keys, meta = list(f.keys()), f.metadata()
    assert keys and all(".lora_" in k for k in keys)
    assert meta["lora_rank"] == "4" and float(meta["lora_alpha"]) == 8.0
    full = sum(p.numel() for p in tr.model.parameters())
    assert sum(p.numel() for p in adapter_state(tr.model).values()) < full / 10
    cfg3 = config.load("tiny", None, {**LORA, "train.iterations": 3, "algo.mode": "per", "train.sft_steps": 5})
    resumed = Trainer(cfg3, run, resume=True)
    for n, p in adapter_state(tr.model).items():
        assert torch.equal(dict(resumed.model.named_parameters())[n], p), n
    rows = resumed.run()
    assert len(rows) == 1 and resumed.iteration == 3


def test_a_resume_without_the_adapters_is_refused(lora_run):
    _, run, _ = lora_run
    with pytest.raises(ValueError, match="saved with LoRA adapters, the model has no adapters"):
        Trainer(config.load("tiny", None, {"train.iterations": 3, "algo.mode": "per", "train.sft_steps": 0}),
                run, resume=True)


def test_export_merges_the_adapters_with_the_trainers_logprobs(lora_run, tmp_path):
    """export (and final/, written by the same save_hf) gives a plain Hugging Face folder."""
    from transformers import AutoModelForCausalLM

    tr, run, _ = lora_run
    torch.manual_seed(0)
    ep = rollout(tr.engine, tr.tok, "frozenlake", {"max_turns": 2}, [11, 12], 2, tr.cfg.rollout.max_new_tokens,
                 tr.cfg.rollout.max_len, FULL)
    want = tr.policy.logprobs(ep.tokens, ep.mask)  # the trainer at iteration 2
    out = export(run, tmp_path / "hf", iteration=2)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert not has_lora(model)
    m = ep.mask[:, 1:]
    base, _, _ = load_policy(config.load("tiny", None, {"train.sft_steps": 0}), torch.device("cpu"))
    moved = float((logprobs_of(base, ep.tokens).float()[m] - want[:, 1:][m]).abs().max())
    print(f"trained adapters moved the log-probs by up to {moved:.4f}")
    assert moved > 1e-3  # 50x the tolerance: a merge at half the scale would fail
    torch.testing.assert_close(logprobs_of(model, ep.tokens).float()[m], want[:, 1:][m], atol=2e-5, rtol=0)


def test_vllm_generates_with_the_merged_adapters(tmp_path):
    if os.environ.get("FRESHPER_REQUIRE_VLLM") != "1":
        pytest.importorskip("vllm")
    cfg = config.load("tiny", None, {**LORA, "rollout.engine": "vllm", "train.iterations": 1,
                                     "rollout.temperature": 1.0, "rollout.top_p": 1.0, "rollout.top_k": 0})
    tr = Trainer(cfg, tmp_path / "run")
    perturb_adapters(tr.model, scale=0.2)
    tr.engine.sync_weights(tr.model)
    torch.manual_seed(0)
    ep = rollout(tr.engine, tr.tok, "frozenlake", {"max_turns": 2}, [7, 8], 2, cfg.rollout.max_new_tokens,
                 cfg.rollout.max_len, FULL)
    mask = ep.mask
    assert mask.sum() > 0
    # the engine's float32 log-probs against the trainer's: 1e-4, as without LoRA (test_vllm_engine)
    torch.testing.assert_close(tr.policy.logprobs(ep.tokens, mask).cpu()[mask], ep.engine_logp[mask], atol=1e-4,
                               rtol=0)


def test_the_kl_reference_of_a_lora_run_is_the_base_without_a_copy():
    """kl_coef > 0 with LoRA: no second copy of the weights, and the reference log-probs are the
    base model's however far the adapters moved (the adapters are perturbed: a reference that
    kept them on would give the policy's own log-probs, 0.1 or more away)."""
    cfg = config.load("tiny", None, {**LORA, "algo.kl_coef": 0.05})
    torch.manual_seed(0)
    model, _, _ = load_policy(cfg, torch.device("cpu"))
    plain, _, _ = load_policy(config.load("tiny", None, {"train.sft_steps": 0}), torch.device("cpu"))
    policy = Policy(model, cfg, torch.device("cpu"))
    assert policy.ref_model is None and policy.ref_net is None
    perturb_adapters(model)
    tokens = torch.randint(0, plain.config.vocab_size, (3, 40), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[:, 20:] = True
    ref = policy.logprobs(tokens, mask, ref=True)
    own = policy.logprobs(tokens, mask)
    base = logprobs_of(plain, tokens).float()
    assert float((own[:, 1:][mask[:, 1:]] - base[mask[:, 1:]]).abs().max()) > 0.1
    torch.testing.assert_close(ref[:, 1:][mask[:, 1:]], base[mask[:, 1:]], atol=2e-5, rtol=0)
    assert all(p.requires_grad for n, p in model.named_parameters() if ".lora_" in n), "adapters back on"
    st = policy.update(tokens, mask, own, mask.float())
    assert st["grad_norm"] > 0


@pytest.mark.parametrize("targets,what", [("q_proj,embed_tokens", "Embedding"), ("lm_head", "the LM head")])
def test_lora_targets_that_are_not_decoder_linears_are_refused(targets, what):
    with pytest.raises(ValueError, match=f"model.lora_targets '{targets}': .* is {what}"):
        load_policy(config.load("tiny", None, {**LORA, "model.lora_targets": targets}), torch.device("cpu"))


def test_a_bf16_lora_checkpoint_exports_bf16(tmp_path):
    """The checkpoint holds float32 adapters only; the base's dtype comes from its metadata."""
    from freshper.trainer.model.lora import lora_metadata

    cfg = config.load("tiny", None, {**LORA, "model.dtype": "bfloat16"})
    model, _, _ = load_policy(cfg, torch.device("cpu"))
    assert lora_metadata(model)["base_dtype"] == "bfloat16"
    cfg = config.load("tiny", None, {**LORA, "model.dtype": "bfloat16", "train.iterations": 1})
    Trainer(cfg, tmp_path / "run").run()
    out = export(tmp_path / "run", tmp_path / "hf")
    with safe_open(str(next(out.glob("*.safetensors"))), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}


def test_the_perception_cache_tells_a_lora_model_from_a_full_one():
    from freshper.trainer.train.perception import cache_path

    full = cache_path("/m/tiny", 10, 1e-3, 0)
    lora = cache_path("/m/tiny", 10, 1e-3, 0, {"lora_rank": "4", "lora_alpha": "8.0", "lora_targets": "q_proj"})
    assert full != lora and full == cache_path("/m/tiny", 10, 1e-3, 0)
