"""bf16 compute over float32 masters (trainer/model/precision.py).

An all-bf16 model under AdamW drops steps of the paper's size (lr 1e-6): the step test fails for it
(checked once by loading without masters). The gradient test's bound is the all-bf16 model's own
gradient error against float64; a halved gradient fails it (checked once). The engine test holds
that generation runs in bf16 too, and that its log-probs are within twice the error of the
trainer's bf16 recompute of float64's.
"""
import copy
import importlib
import logging

import pytest
import torch

from freshper.trainer import config
from freshper.trainer.config import env_kwargs
from freshper.trainer.engines.base import Sampling
from freshper.trainer.engines.hf import HFEngine
from freshper.trainer.model.load import load_policy, pick_dtype
from freshper.trainer.model.policy import Policy
from freshper.trainer.model.precision import ATTR, CPU_BF16_ENV, compute_dtype, cpu_bf16, head_path, keep_masters
from freshper.trainer.train.rollout import rollout

CPU = torch.device("cpu")


def _cfg(**over):
    return config.load("tiny", None, {"train.sft_steps": 0, "algo.warmup_steps": 0, "algo.lr_schedule": "constant",
                                      "algo.kl_coef": 0.0, **over})


def _rows(vocab: int, seed: int = 0):
    """Four rows of 24 tokens, the last 10 of each a reply, with advantages +1, -1, +1, -1."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (4, 24), generator=g)
    mask = torch.zeros(4, 24, dtype=torch.bool)
    mask[:, 14:] = True
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])[:, None] * mask.float()
    return tokens, mask, adv


def test_keep_masters_makes_what_trains_float32_and_leaves_frozen_weights():
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)).to(torch.bfloat16)
    net[1].requires_grad_(False)
    keep_masters(net, torch.bfloat16)
    assert [p.dtype for p in net[0].parameters()] == [torch.float32] * 2
    assert [p.dtype for p in net[1].parameters()] == [torch.bfloat16] * 2
    assert compute_dtype(net) == torch.bfloat16
    frozen32 = torch.nn.Linear(4, 4).requires_grad_(False)
    keep_masters(frozen32, torch.bfloat16)
    assert {p.dtype for p in frozen32.parameters()} == {torch.bfloat16}, "a frozen float32 weight needs no master"
    plain = torch.nn.Linear(4, 4)
    keep_masters(plain, torch.float32)
    assert compute_dtype(plain) is None and not hasattr(plain, ATTR)
    with pytest.raises(ValueError, match="compute"):
        keep_masters(torch.nn.Linear(4, 4).to(torch.bfloat16), torch.int8)


def test_auto_is_bf16_on_cpus_with_avx512_bf16(tmp_path, monkeypatch):
    """`auto` follows the registered comparison: bf16 where the CPU has AVX512-BF16 (read from
    /proc/cpuinfo's flags, or forced by FRESHPER_CPU_BF16), float32 on other CPUs; an explicit
    dtype is kept whatever the CPU."""
    flags = "flags\t\t: fpu sse2 avx2 avx512f avx512_vnni{}\n"
    with_bf16, without = tmp_path / "with", tmp_path / "without"
    with_bf16.write_text("processor\t: 0\n" + flags.format(" avx512_bf16"))
    without.write_text("processor\t: 0\n" + flags.format(" avx512_bf16x"))  # a longer name is not the flag
    monkeypatch.delenv(CPU_BF16_ENV)
    assert cpu_bf16(str(with_bf16)) and not cpu_bf16(str(without)) and not cpu_bf16(str(tmp_path / "none"))
    monkeypatch.setenv(CPU_BF16_ENV, "1")
    assert cpu_bf16(str(without)) and pick_dtype(_cfg(), CPU) == torch.bfloat16
    assert pick_dtype(_cfg(**{"model.dtype": "float32"}), CPU) == torch.float32
    monkeypatch.setenv(CPU_BF16_ENV, "0")
    assert not cpu_bf16(str(with_bf16)) and pick_dtype(_cfg(), CPU) == torch.float32
    assert pick_dtype(_cfg(**{"model.dtype": "bfloat16"}), CPU) == torch.bfloat16
    monkeypatch.setenv(CPU_BF16_ENV, "yes")
    with pytest.raises(ValueError, match="FRESHPER_CPU_BF16 must be '0' or '1'"):
        cpu_bf16()


def test_a_bf16_run_loads_with_masters_and_logs_its_compute_dtype():
    model, _, _ = load_policy(_cfg(**{"model.dtype": "bfloat16"}), CPU)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert compute_dtype(model) == torch.bfloat16
    fp32, _, _ = load_policy(_cfg(), CPU)
    assert compute_dtype(fp32) is None


@pytest.mark.parametrize("caps,path", [((True, True), "out_dtype"), ((True, False), "out_dtype-mm"),
                                       ((False, False), "upcast")])
def test_the_log_names_the_float32_logits_path_and_warns_where_it_is_slower_than_eager(caps, path, monkeypatch):
    """The kernel's out_dtype probe faked for each torch (2.10+ on CUDA; 2.8-2.9; before 2.8): the
    line names the path it chose, a WARNING naming --model.logits_dtype compute where that path
    is slower than eager (the upcast on a GPU), INFO elsewhere and on the CPU, whose designed path
    the upcast is; nothing to say in float32. Fails with the warning on every path, or on none
    (checked once each)."""
    mod = importlib.import_module("freshper.kernels.fused_linear_policy_loss")
    have = dict(zip(("mm", "addmm"), caps))
    monkeypatch.setattr(mod, "has_out_dtype", lambda op, device, dtype=torch.bfloat16: have[op])
    level, line = head_path("float32", "cuda", torch.bfloat16)
    assert f"path {path}: " in line and line.startswith("LM head: float32 logits from bfloat16 operands"), line
    assert level == (logging.WARNING if path == "upcast" else logging.INFO), (level, line)
    assert ("--model.logits_dtype compute" in line) is (path == "upcast"), line
    assert head_path("float32", "cpu", torch.bfloat16)[0] == logging.INFO
    assert head_path("float32", "cuda", None) is None and head_path("float32", "cuda", torch.float32) is None
    assert head_path("compute", "cuda", torch.float16) == (
        logging.INFO, "LM head: logits rounded to float16 (model.logits_dtype compute)")


def test_a_bf16_policy_logs_its_heads_path_once(caplog):
    """The trainer's Policy says which path its loss takes, once; on this CPU's torch (no
    out_dtype) the upcast, the CPU's designed path, at INFO."""
    model, _, _ = load_policy(_cfg(**{"model.dtype": "bfloat16"}), CPU)
    with caplog.at_level(logging.INFO, logger="freshper"):
        Policy(model, _cfg(**{"model.dtype": "bfloat16"}), CPU)
    said = [r for r in caplog.records if r.getMessage().startswith("LM head:")]
    assert len(said) == 1 and said[0].levelno == logging.INFO, [r.getMessage() for r in said]
    assert "path upcast: " in said[0].getMessage()


def test_a_bf16_full_fine_tune_starts_from_the_checkpoints_float32_values():
    """The masters are the float32 checkpoint's numbers, not their bf16 roundings (checked once: a
    bf16 load fails here); a LoRA run's frozen base loads in bf16, its adapters train in float32."""
    fp32, _, _ = load_policy(_cfg(), CPU)
    bf16, _, _ = load_policy(_cfg(**{"model.dtype": "bfloat16"}), CPU)
    off_grid = 0
    for (name, a), (_, b) in zip(fp32.named_parameters(), bf16.named_parameters()):
        assert torch.equal(a, b), f"{name}: the master is not the checkpoint's value"
        off_grid += int((a != a.to(torch.bfloat16).float()).sum())
    assert off_grid > 0, "the checkpoint's weights are all bf16 numbers: the comparison cannot fail"
    lora, _, _ = load_policy(_cfg(**{"model.dtype": "bfloat16", "model.lora_rank": 4}), CPU)
    kinds = {(p.requires_grad, p.dtype) for p in lora.parameters()}
    assert kinds == {(False, torch.bfloat16), (True, torch.float32)}, kinds


def test_a_step_at_the_papers_learning_rate_moves_the_weights():
    """AdamW's first step is lr * g / (|g| + eps): every weight with a gradient moves by lr. On bf16
    weights of size ~0.02 a step of 1e-6 is below half their spacing (6e-5) and is lost."""
    lr = 1e-6
    cfg = _cfg(**{"model.dtype": "bfloat16", "algo.lr": lr})
    model, tok, _ = load_policy(cfg, CPU)
    policy = Policy(model, cfg, CPU)
    weight = policy.model.model.layers[0].mlp.up_proj.weight
    before = weight.detach().clone()
    tokens, mask, adv = _rows(model.get_input_embeddings().num_embeddings)
    st = policy.update(tokens, mask, None, adv)
    assert st["grad_norm"] > 0
    moved = (weight.detach() - before).abs()
    assert float((moved > 0).float().mean()) > 0.9, "most weights did not move: the step was lost to rounding"
    ratio = float(moved[moved > 0].median()) / lr
    assert 0.9 < ratio < 1.1, f"median step {ratio:.3f} x lr, Adam's first step is 1 x lr"


def _grads(model, cfg, tokens, mask, adv) -> torch.Tensor:
    """The update's gradient, flattened in float64 (read before the step: a fresh policy each call)."""
    policy = Policy(model, cfg, CPU)
    policy.update(tokens, mask, None, adv)
    return torch.cat([p.grad.double().flatten() for p in policy.model.parameters()])


def test_masters_with_bf16_compute_are_no_less_accurate_than_an_all_bf16_model():
    """The three models hold the same numbers (float32 weights rounded to bf16): float64 is the
    reference, the all-bf16 model (the honest low-precision baseline) sets the bound."""
    cfg = _cfg()
    model, tok, _ = load_policy(cfg, CPU)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    tokens, mask, adv = _rows(model.get_input_embeddings().num_embeddings, seed=1)
    ref = _grads(copy.deepcopy(model).double(), cfg, tokens, mask, adv)
    all_bf16 = _grads(copy.deepcopy(model).to(torch.bfloat16), cfg, tokens, mask, adv)
    masters = _grads(keep_masters(copy.deepcopy(model), torch.bfloat16), cfg, tokens, mask, adv)
    err = lambda g: float((g - ref).norm() / ref.norm())  # noqa: E731
    assert err(all_bf16) > 1e-4, "the baseline is not low precision: the bound would be meaningless"
    assert err(masters) <= err(all_bf16), f"masters {err(masters):.2e} against all-bf16 {err(all_bf16):.2e}"


def test_the_engine_samples_in_bf16_with_the_log_probs_the_trainer_recomputes():
    cfg = _cfg(**{"model.dtype": "bfloat16"})
    torch.manual_seed(0)
    model, tok, _ = load_policy(cfg, CPU)
    engine = HFEngine(model, tok)
    seen = []  # what the engine's linear layers compute in (the cache's dtype follows the rotary tables)
    hook = model.model.layers[0].self_attn.v_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    ep = rollout(engine, tok, "frozenlake", env_kwargs(cfg), [3, 4], 2, cfg.rollout.max_new_tokens,
                 cfg.rollout.max_len, Sampling(1.0, 1.0, 0))
    hook.remove()
    assert seen and set(seen) == {torch.bfloat16}, f"the engine computed in {set(seen)}, not bf16"
    sel = ep.mask
    trainer = Policy(model, cfg, CPU).logprobs(ep.tokens, ep.mask)[sel]
    exact_model = copy.deepcopy(model).double()
    delattr(exact_model, ATTR)  # float64 compute: the reference
    exact = Policy(exact_model, _cfg(), CPU).logprobs(ep.tokens, ep.mask)[sel]
    own_error = float((trainer - exact).abs().max())
    assert own_error > 0, "the recompute is not in bf16: the bound would be meaningless"
    engine_error = float((ep.engine_logp[sel] - exact).abs().max())
    assert engine_error <= 2 * own_error, f"the engine's log-probs are {engine_error:.2e} off float64's, the " \
                                          f"trainer's bf16 recompute {own_error:.2e}"
