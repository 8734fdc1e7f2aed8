"""`freshper train` against TRL's GRPOTrainer on the same job: seconds per iteration split into
generation and the rest, generated tokens per second of generation, peak memory.

The job (preset smollm2-135m-math): SmolLM2-135M-Instruct, one-digit addition, 32 replies per
iteration (4 prompts x 8), replies of up to 32 tokens at temperature 1, one AdamW step per
iteration at lr 1e-5 (constant), HF generation on both sides (`--engine vllm`: vLLM colocated
in the process on both sides). One dtype on both sides, pinned (`_dtype`): float32 on the CPU
(ours with `--model.dtype float32`, since `auto` is bf16 on CPUs with AVX512-BF16 while TRL's
side runs float32 on any CPU), bf16 compute over float32 masters on CUDA (ours `bfloat16`, TRL's
bf16=True on the float32 model). Replay off: our on-policy
arm against GRPOTrainer; replay on: our FreshPER arm (K = 1, 32 replayed trajectories) against
FreshPERGRPOTrainer (replay_updates 1, replay_batch_size 32). Activation (gradient)
checkpointing is set alike on both sides (`--checkpointing`; off by default, as in our preset:
GRPOConfig turns it on unless told, trading a second forward for memory). Each (side, replay,
threads) runs in its own process (peak RSS is per process), sides alternating, the first
`--skip` iterations left out of the means (first-call costs). `--together` runs the two sides at the same time, so
that each sees the same load (the 1-thread rows: two 1-thread processes on two cores).

    python -m freshper.profiling.bench_trl --iterations 6 --threads 1,2   # the table
    python -m freshper.profiling.bench_trl --one ours --replay 0 --threads 1  # one process: a JSON line

`--model random-qwen2.5-0.5b` (the GPU comparison): the same job with Qwen2.5-0.5B's architecture
and random weights on both sides (trainer/model/random_init.py: shipped config, byte-level
tokenizer, weights drawn under the run's seed), on CUDA where there is one: both sides in bf16
compute over float32 masters, as above. Rewards mean nothing with random weights; the work per iteration is the point:
`--new-tokens N` sets both sides' reply limit, and a random policy over 151,936 ids all but
never ends a reply early (its EOS has probability ~1/151,936 a token), so both sides generate N
tokens a reply; the table's gen tokens column shows it. Peak memory is the GPU's on CUDA.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

PRESET = "smollm2-135m-math"
RANDOM_QWEN = "Qwen/Qwen2.5-0.5B-Instruct"
MODEL = {"model": "smollm2", "new_tokens": 0}  # set by main(): which model, and fixed reply lengths (0: off)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _peak_gb() -> float:
    if _cuda():
        import torch

        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def _dtype() -> str:
    """The one compute dtype both sides run in: bf16 on CUDA (TRL's bf16=True), float32 on the CPU,
    where TRL's side has no bf16 and ours would take `auto`'s bf16 on an AVX512-BF16 CPU."""
    return "bfloat16" if _cuda() else "float32"


def _overrides() -> dict:
    """Config values of the chosen model on our side (and the job both sides run), its dtype pinned."""
    out = {"model.dtype": _dtype()}
    if MODEL["model"] == "random-qwen2.5-0.5b":
        out.update({"model.path": RANDOM_QWEN, "model.init": "random"})
    if MODEL["new_tokens"]:
        out["rollout.max_new_tokens"] = MODEL["new_tokens"]
    return out


def run_ours(replay: bool, iterations: int, skip: int, out: str, checkpointing: bool, engine: str) -> dict:
    from freshper.trainer import config
    from freshper.trainer.train.loop import Trainer

    cfg = config.load(PRESET, None, {"algo.mode": "freshper" if replay else "on-policy",
                                     "train.iterations": iterations, "eval.every": 0, "train.progress": False,
                                     "model.gradient_checkpointing": checkpointing, "rollout.engine": engine,
                                     **_overrides()})
    rows = Trainer(cfg, os.path.join(out, "ours")).run()[skip:]

    def mean(k):
        return sum(r.get(k, 0.0) for r in rows) / len(rows)

    top = ["time_rollout", "time_logprob_recompute", "time_onpolicy_update", "time_buffer_add", "time_sample",
           "time_replay_update", "time_priority_update", "time_weight_sync"]
    total = sum(mean(k) for k in top)
    return {"s_per_iter": total, "generate_s": mean("time_generate"), "rest_s": total - mean("time_generate"),
            "gen_tokens": mean("gen_tokens"), "reward": mean("reward")}


def _dataset(n: int):
    from datasets import Dataset

    from freshper.trainer import config
    from freshper.trainer.config import env_kwargs
    from freshper.trainer.envs import make_env

    cfg = config.load(PRESET, None, _overrides())
    env = make_env("math", **env_kwargs(cfg))
    rows = []
    for seed in range(n):
        rows.append({"prompt": env.opening(env.reset(seed), cfg.rollout.max_new_tokens), "answer": env.answer})
    return Dataset.from_list(rows), cfg


def run_trl(replay: bool, iterations: int, skip: int, out: str, checkpointing: bool, engine: str) -> dict:
    import trl
    from transformers import TrainerCallback

    from freshper.integrations.trl import FreshPERGRPOConfig, FreshPERGRPOTrainer
    from freshper.trainer.envs.math import score
    from freshper.trainer.model.load import model_path

    ds, cfg = _dataset(4 * iterations)
    r = cfg.rollout

    def reward(completions, answer, **kw):
        return [score(c[0]["content"], a, cfg.env.scorer) for c, a in zip(completions, answer)]

    cuda = _cuda()
    common = dict(output_dir=os.path.join(out, "trl"), use_cpu=not cuda, report_to=[], save_strategy="no",
                  per_device_train_batch_size=r.episodes, num_generations=r.group_size,
                  max_completion_length=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                  top_k=r.top_k or None, learning_rate=cfg.algo.lr, lr_scheduler_type="constant", warmup_steps=0,
                  beta=0.0, max_steps=iterations, logging_steps=1, bf16=_dtype() == "bfloat16", seed=cfg.train.seed,
                  gradient_accumulation_steps=1, disable_tqdm=True, gradient_checkpointing=checkpointing)
    if engine == "vllm":  # TRL's colocated engine: vLLM in this process, as ours
        common.update(use_vllm=True, vllm_mode="colocate", vllm_max_model_length=r.max_len,
                      vllm_enable_sleep_mode=False)
    if replay:
        args = FreshPERGRPOConfig(**common, replay_updates=1, replay_batch_size=cfg.algo.replay_batch,
                                  replay_tau=cfg.algo.tau)
        cls = FreshPERGRPOTrainer
    else:
        args, cls = trl.GRPOConfig(**common), trl.GRPOTrainer
    model, tok = model_path(cfg), None
    if cfg.model.init == "random":  # the same architecture, weights and tokenizer as ours
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from freshper.trainer.model.random_init import random_model

        model = random_model(model, AutoModelForCausalLM, None, "sdpa", cfg.train.seed)
        tok = AutoTokenizer.from_pretrained(model_path(cfg))
    tr = cls(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok)

    steps, gen, toks = [], [], []
    inner = tr._generate

    def timed_generate(prompts):
        t0 = time.perf_counter()
        res = inner(prompts)
        gen.append(time.perf_counter() - t0)
        return res

    tr._generate = timed_generate

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            steps.append(time.perf_counter() - self.t0)

        def on_log(self, args, state, control, logs=None, **k):
            if logs and "completions/mean_length" in logs:
                toks.append(logs["completions/mean_length"] * r.episodes)

    tr.add_callback(Clock())
    tr.train()
    n = len(steps) - skip
    s, g = sum(steps[skip:]) / n, sum(gen[skip:len(steps)]) / n
    rewards = [h["reward"] for h in tr.state.log_history if "reward" in h][skip:]
    kept = toks[skip:]
    return {"s_per_iter": s, "generate_s": g, "rest_s": s - g, "gen_tokens": sum(kept) / max(len(kept), 1),
            "reward": sum(rewards) / max(len(rewards), 1)}


def one(side: str, replay: bool, threads: int, iterations: int, skip: int, checkpointing: bool,
        engine: str) -> dict:
    import torch

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as out:
        res = (run_ours if side == "ours" else run_trl)(replay, iterations, skip, out, checkpointing, engine)
    return {"side": side, "replay": replay, "threads": threads, "checkpointing": checkpointing, "engine": engine,
            **res,
            "tokens_per_s": res["gen_tokens"] / res["generate_s"], "peak_rss_gb": _peak_gb()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=6, help="iterations (optimizer steps) per run")
    p.add_argument("--skip", type=int, default=1, help="first iterations left out of the means")
    p.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    p.add_argument("--replay", default="0,1", help="0 (off), 1 (on), or both")
    p.add_argument("--checkpointing", type=int, choices=(0, 1), default=0,
                   help="activation checkpointing on both sides (1) or on neither (0)")
    p.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                   help="generation on both sides: transformers generate, or vLLM colocated in the process")
    p.add_argument("--together", action="store_true",
                   help="run the two sides at the same time (each sees the other's load: fair on a shared machine)")
    p.add_argument("--one", choices=("ours", "trl"), help="run one side in this process and print a JSON line")
    p.add_argument("--model", choices=("smollm2", "random-qwen2.5-0.5b"), default="smollm2",
                   help="SmolLM2-135M (the CPU job), or Qwen2.5-0.5B's architecture with random weights")
    p.add_argument("--new-tokens", type=int, default=0,
                   help="reply limit in tokens on both sides (0: the preset's)")
    a = p.parse_args(argv)
    MODEL.update(model=a.model, new_tokens=a.new_tokens)
    if a.iterations <= a.skip:
        p.error(f"--iterations ({a.iterations}) must exceed --skip ({a.skip})")
    threads = [int(t) for t in a.threads.split(",")]
    replays = [bool(int(x)) for x in a.replay.split(",")]
    if a.one:
        print(json.dumps(one(a.one, replays[0], threads[0], a.iterations, a.skip, bool(a.checkpointing), a.engine)))
        return
    results = []
    for t in threads:
        for rp in replays:
            procs = {}
            for side in ("ours", "trl"):
                cmd = [sys.executable, "-m", "freshper.profiling.bench_trl", "--one", side, "--replay", str(int(rp)),
                       "--threads", str(t), "--iterations", str(a.iterations), "--skip", str(a.skip),
                       "--checkpointing", str(a.checkpointing), "--engine", a.engine, "--model", a.model,
                       "--new-tokens", str(a.new_tokens)]
                env = {**os.environ, "OMP_NUM_THREADS": str(t)}
                procs[side] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                if not a.together:
                    procs[side].wait()
            for side, proc in procs.items():
                out, err = proc.communicate()
                if proc.returncode:
                    sys.exit(f"{side} replay={rp} threads={t} failed:\n{err[-3000:]}")
                results.append(json.loads(out.strip().splitlines()[-1]))
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(f"activation checkpointing: {'on' if a.checkpointing else 'off'} on both sides; generation: {a.engine}; "
          f"sides {'at the same time' if a.together else 'one after the other'}")
    print("| threads | replay | side | s/iteration | generate s | rest s | gen tokens/s | peak RSS GB | reward |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t in threads:
        for rp in replays:
            pair = {x["side"]: x for x in results if x["threads"] == t and x["replay"] == rp}
            for side in ("ours", "trl"):
                x = pair[side]
                print(f"| {t} | {'on' if rp else 'off'} | {side} | {x['s_per_iter']:.2f} | {x['generate_s']:.2f} | "
                      f"{x['rest_s']:.2f} | {x['tokens_per_s']:.0f} | {x['peak_rss_gb']:.2f} | {x['reward']:.3f} |")
            o, q = pair["ours"], pair["trl"]
            print(f"| {t} | {'on' if rp else 'off'} | ours / trl | {o['s_per_iter'] / q['s_per_iter']:.2f}x | "
                  f"{o['generate_s'] / q['generate_s']:.2f}x | {o['rest_s'] / q['rest_s']:.2f}x | | "
                  f"{o['peak_rss_gb'] / q['peak_rss_gb']:.2f}x | |")


if __name__ == "__main__":
    main()
