"""The training loop: one iteration is

    rollout (engine.generate <-> env.step) -> log-prob recompute -> advantages
    -> one on-policy update -> buffer.add -> K x [sample -> replay update -> priority update]
    -> weight sync to the engine -> (every k iterations) checkpoint

The arm is `algo.mode`: on-policy (K = 0), per (no decay), freshper (exp(-age / tau) decay),
uniform (replay without priorities). The buffer's step is the iteration number, so tau is in
iterations, as in the paper.
"""
from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from freshper import ReplayBuffer, base_priority, linear_beta
from freshper.profiling.nvtx import Ranges

from . import checkpoint as ckpt
from .advantages import advantages
from .config import Config, to_yaml
from .drift import DriftTau
from .engines.base import make_engine
from .envs import make_env
from .metrics import MetricsLog, plot
from .model import env_kwargs, load_policy, pick_device
from .policy import Policy
from .rollout import Trajectories, rollout

log = logging.getLogger("freshper")


def seed_everything(seed: int) -> None:
    """Seed every global stream the run draws from: torch (CPU and CUDA), numpy, random."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_deterministic() -> None:
    """Ask every GPU library for its deterministic kernels (set before they first run): torch's
    deterministic algorithms, a fixed cuBLAS workspace, flash-attn's deterministic backward and
    vLLM's batch-invariant kernels. CPU runs are deterministic without it."""
    import os

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    os.environ.setdefault("FLASH_ATTENTION_DETERMINISTIC", "1")
    os.environ.setdefault("VLLM_BATCH_INVARIANT", "1")
    torch.use_deterministic_algorithms(True, warn_only=True)  # warn, not fail, where no such kernel exists
    torch.backends.cudnn.benchmark = False


def group_seeds(seed: int, iteration: int, groups: int) -> list[int]:
    """Initial states of iteration `iteration`: a pure function of (seed, iteration), so a resumed
    run and each arm of a comparison see the same environments."""
    return [(seed * 1_000_003 + iteration * 1_009 + g * 7_919) % (2**31 - 1) for g in range(groups)]


def _rows(tokens, mask, *per_traj):
    """Flatten (E, turns, L) to the rows that hold a response; per-trajectory (E,) tensors are
    repeated per row."""
    has = mask.any(-1)  # (E, turns)
    traj = row_trajectory(mask)
    out = [tokens[has], mask[has]]
    for t in per_traj:
        out.append(None if t is None else (t[has] if t.dim() == 3 else t[traj]))
    return out


def row_trajectory(mask: torch.Tensor) -> torch.Tensor:
    """For each row `_rows` returns, the index of its trajectory."""
    return mask.any(-1).nonzero()[:, 0]


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path, resume: bool = False):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        if cfg.train.deterministic:
            make_deterministic()
        self.device = pick_device(cfg)
        self.model, self.tok, self.model_path = load_policy(cfg, self.device)
        # Seeded after the model exists: building it on a cold cache, or loading it from a warm
        # one, must not decide the sampling streams, so a run is a function of (config, seed).
        seed_everything(cfg.train.seed)
        self.policy = Policy(self.model, cfg, self.device)
        self.ranges = Ranges()
        a = cfg.algo
        self.K = 0 if a.mode == "on-policy" else a.replay_updates
        self.beta = linear_beta(a.beta, a.beta_end, steps=max(1, a.beta_steps))
        self.drift = DriftTau(a.tau, a.tau_min, a.tau_max, a.drift_ema) if a.tau_auto and a.mode == "freshper" else None
        self.buffer = None
        self.iteration = 0
        self.env_steps = 0
        self.episodes = 0
        self.sft_losses: list[float] = []
        if resume:
            path = ckpt.latest(self.run_dir / "checkpoints")
            state, self.buffer = ckpt.load(path, self.policy, self.device, self.beta)
            self.iteration, self.env_steps, self.episodes = state["iteration"], state["env_steps"], state["episodes"]
            if self.drift is not None and state.get("drift"):
                self.drift.load(state["drift"])
            log.info("resumed from %s (iteration %d, %d env steps)", path, self.iteration, self.env_steps)
        else:
            (self.run_dir / "config.yaml").write_text(to_yaml(cfg))
            self.sft_losses = self.policy.warm_start(self.tok, self._new_env, cfg.train.sft_steps, cfg.train.sft_lr,
                                                     cfg.train.seed)
            if self.sft_losses:
                log.info("warm start: %d supervised steps on well-formed *random* actions (format only), "
                         "loss %.3f -> %.3f", len(self.sft_losses), self.sft_losses[0], self.sft_losses[-1])
        if self.buffer is None and self.K > 0:
            self.buffer = ReplayBuffer(a.capacity, mode=a.mode, alpha=a.alpha, beta=self.beta, tau=a.tau, eps=a.eps,
                                       eviction=a.eviction, device=self.device, seed=cfg.train.seed)
        self.engine = make_engine(cfg.rollout.engine, self.model, self.tok, cfg, self.device)
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl", resume_from=self.iteration if resume else None)

    def _new_env(self):
        return make_env(self.cfg.env.name, **env_kwargs(self.cfg))

    # --------------------------------------------------------------------------- one iteration
    def _priority(self, reward, adv):
        return base_priority(self.cfg.algo.priority, rewards=reward, advantages=adv[:, None],
                             mask=torch.ones_like(adv[:, None], dtype=torch.bool)).double()

    def iteration_step(self) -> dict:
        cfg, it, R = self.cfg, self.iteration, self.ranges
        times = {}
        t0 = time.perf_counter()
        with R.range("rollout"):
            self.engine.wake()
            groups = cfg.rollout.episodes // cfg.rollout.group_size
            traj: Trajectories = rollout(self.engine, self.tok, cfg.env.name, env_kwargs(cfg),
                                         group_seeds(cfg.train.seed, it, groups), cfg.rollout.group_size,
                                         cfg.rollout.max_new_tokens, cfg.rollout.max_len, cfg.rollout.temperature,
                                         nvtx=R)
            self.engine.sleep()
        times["rollout"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        with R.range("logprob_recompute"):
            tokens, mask, elogp = _rows(traj.tokens, traj.mask, traj.engine_logp)
            old_logp = self.policy.logprobs(tokens, mask)
        times["recompute"] = time.perf_counter() - t0
        mismatch = float((old_logp - elogp)[mask].abs().max()) if mask.any() else 0.0

        adv = advantages(cfg.algo.advantage, traj.reward, traj.group)
        t0 = time.perf_counter()
        with R.range("onpolicy_update"):
            _, _, row_adv = _rows(traj.tokens, traj.mask, adv)
            on = self.policy.update(tokens, mask, old_logp, row_adv, None, elogp)
        times["onpolicy"] = time.perf_counter() - t0

        replay = {}
        if self.buffer is not None:
            t0 = time.perf_counter()
            with R.range("buffer_add"):
                full_logp = torch.zeros(traj.tokens.shape, dtype=torch.float32)
                full_logp[traj.mask.any(-1)] = old_logp
                self.buffer.add(self._priority(traj.reward, adv), step=it, tokens=traj.tokens.to(torch.int32),
                                mask=traj.mask, old_logp=full_logp, engine_logp=traj.engine_logp,
                                adv=adv.float(), reward=traj.reward.float())
            times["buffer_add"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            replay = self._replay(it)
            times["replay"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        with R.range("weight_sync"):
            sync_s = self.engine.sync_weights(self.model)
        times["sync"] = time.perf_counter() - t0

        self.iteration += 1
        self.env_steps += traj.env_steps
        self.episodes += len(traj)
        row = {
            "iteration": it, "env_steps": self.env_steps, "episodes": self.episodes,
            "reward": float(traj.reward.mean()), "success": float(traj.success.float().mean()),
            "valid_action": float(traj.valid_frac.mean()), "turns": float(traj.turns.float().mean()),
            "gen_tokens": traj.gen_tokens, "loss": on["loss"], "clip_frac": on["clip_frac"],
            "ratio_mean": on["ratio_mean"], "grad_norm": on["grad_norm"], "lr": self.policy.sched.get_last_lr()[0],
            "engine_trainer_logp_maxdiff": mismatch, "weight_sync_s": sync_s,
            "buffer_size": len(self.buffer) if self.buffer is not None else 0, **replay,
            **{f"time_{k}": round(v, 4) for k, v in times.items()},
        }
        return row

    def _replay(self, it: int) -> dict:
        a, R = self.cfg.algo, self.ranges
        stats = {"replay_loss": [], "replay_clip_frac": [], "is_ess": [], "replay_age_mean": [], "replay_age_max": [],
                 "replay_ratio_mean": []}
        for _ in range(self.K):
            with R.range("sample"):
                b = self.buffer.sample(a.replay_batch, step=it)
            with R.range("replay_update"):
                tokens, mask, old, elogp, w, adv = _rows(b.tokens.long().cpu(), b.mask.cpu(), b.old_logp.cpu(),
                                                         b.engine_logp.cpu(), b.weights.float().cpu(), b.adv.cpu())
                if self.drift is not None:
                    self._observe_drift(b, tokens, mask, old)
                st = self.policy.update(tokens, mask, old, adv, w, elogp)
            with R.range("priority_update"):
                self.buffer.update_priorities(b.indices, self._priority(b.reward.cpu(), b.adv.cpu()))
            wts = b.weights.double()
            stats["replay_loss"].append(st["loss"])
            stats["replay_clip_frac"].append(st["clip_frac"])
            stats["replay_ratio_mean"].append(st["ratio_mean"])
            stats["is_ess"].append(float(wts.sum() ** 2 / (wts ** 2).sum() / wts.numel()))
            stats["replay_age_mean"].append(float(b.age.double().mean()))
            stats["replay_age_max"].append(float(b.age.max()))
        out = {k: sum(v) / len(v) for k, v in stats.items() if v}
        if "replay_age_max" in out:
            out["replay_age_max"] = max(stats["replay_age_max"])
        if self.drift is not None:
            self.buffer.set_tau(self.drift.update())
            out.update(tau=self.drift.tau, drift_rate=self.drift.rate)
        return out

    def _observe_drift(self, b, tokens, mask, old) -> None:
        """Per replayed trajectory: its age and the mean over its response tokens of
        log mu - log pi, an estimate of the per-token KL(mu || pi)."""
        new = self.policy.logprobs(tokens, mask)
        traj = row_trajectory(b.mask.cpu())
        total = torch.zeros(len(b), dtype=torch.float64).index_add_(0, traj, ((old - new) * mask).sum(-1).double())
        count = torch.zeros(len(b), dtype=torch.float64).index_add_(0, traj, mask.sum(-1).double())
        self.drift.observe(b.age.cpu(), total / count.clamp_min(1.0))

    # ---------------------------------------------------------------------------------- run
    def save_checkpoint(self) -> Path:
        with self.ranges.range("checkpoint"):
            return ckpt.save(self.run_dir / "checkpoints", self.iteration, self.policy, self.buffer,
                             {"env_steps": self.env_steps, "episodes": self.episodes, "model_path": self.model_path,
                              "drift": self.drift.state() if self.drift is not None else None},
                             self.cfg.train.keep_checkpoints)

    def run(self, iterations: int | None = None, on_iteration=None) -> list[dict]:
        """Train until `train.iterations` (or the env-step budget, or `iterations` more); returns this
        call's metrics rows. `on_iteration(i)` may return a context manager wrapped around iteration i
        (the profiler uses it)."""
        cfg = self.cfg
        end = cfg.train.iterations if iterations is None else min(cfg.train.iterations, self.iteration + iterations)
        bar = None
        if cfg.train.progress:
            from tqdm import tqdm

            bar = tqdm(total=cfg.train.iterations, initial=self.iteration, desc=self.run_dir.name, dynamic_ncols=True)
        rows = []
        while self.iteration < end:
            if cfg.train.env_step_budget and self.env_steps >= cfg.train.env_step_budget:
                log.info("env-step budget %d reached at iteration %d", cfg.train.env_step_budget, self.iteration)
                break
            ctx = on_iteration(self.iteration) if on_iteration else nullcontext()
            with ctx:
                row = self.iteration_step()
            self.metrics.write(row)
            rows.append(row)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(reward=f"{row['reward']:.2f}", success=f"{row['success']:.2f}",
                                env_steps=row["env_steps"])
            else:
                log.info("iter %d  env_steps %d  reward %.3f  success %.2f  loss %.4f", row["iteration"],
                         row["env_steps"], row["reward"], row["success"], row["loss"])
            if self.iteration % cfg.train.checkpoint_every == 0:
                self.save_checkpoint()
        if bar is not None:
            bar.close()
        if rows and self.iteration % cfg.train.checkpoint_every:  # the end, if not just saved
            self.save_checkpoint()
        try:
            png = plot(self.run_dir)
            log.info("learning curve: %s", png)
        except ValueError:
            pass
        return rows
