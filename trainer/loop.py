"""The training loop: one iteration is

    rollout (engine.generate <-> env.step, one chat per episode) -> log-prob recompute
    -> advantages -> one on-policy update -> buffer.add
    -> K x [sample -> replay update -> priority update] -> weight sync to the engine
    -> (every eval.every iterations) validation rollout -> (every k iterations) checkpoint

The arm is `algo.mode`: on-policy (K = 0), per (no decay), freshper (exp(-age / tau) decay),
uniform (replay without priorities). The buffer's step is the iteration number, so tau is in
iterations, as in the paper. Episodes stay on the training device from the rollout to the
buffer and back; each update syncs with the host once for its statistics.
"""
from __future__ import annotations

import logging
from contextlib import nullcontext
from pathlib import Path

import torch

from freshper import ReplayBuffer, base_priority, linear_beta
from freshper.profiling.nvtx import Phases

from . import checkpoint as ckpt
from .advantages import advantages, shape
from .config import Config, buffer_insert, to_yaml
from .drift import DriftTau
from .engines import Sampling, make_engine
from .envs import make_env
from .envs.base import EVAL_SEED_BASE
from .metrics import MetricsLog, plot
from .model import env_kwargs, load_policy, pick_device
from .policy import Policy
from .rollout import rollout
from .trackers import Trackers
from .trackers import check_installed as check_trackers
from .trackers import parse as parse_trackers

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


def replay_signal(group: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """What a replay batch can teach, (2,) float64: the share of its episodes whose group has no
    other member in the batch (a group-relative advantage is 0 for them), and the share of its
    loss tokens whose episode advantage, before whitening, is non-zero (|A| > 1e-6)."""
    _, inv, counts = torch.unique(group, return_inverse=True, return_counts=True)
    singleton = (counts[inv] == 1).double().mean()
    tokens = mask[:, 1:].sum(1).double()
    live = (adv.abs() > 1e-6).double()
    return torch.stack([singleton, (tokens * live).sum() / tokens.sum().clamp_min(1.0)])


def group_seeds(seed: int, iteration: int, groups: int) -> list[int]:
    """Initial states of iteration `iteration`: a pure function of (seed, iteration), so a resumed
    run and each arm of a comparison see the same environments."""
    return [(seed * 1_000_003 + iteration * 1_009 + g * 7_919) % (2**31 - 1) for g in range(groups)]


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path, resume: bool = False):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.tracker_names = parse_trackers(cfg.train.log_to)
        check_trackers(self.tracker_names)  # a missing extra stops the start, before a model is built
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
        a, r = cfg.algo, cfg.rollout
        self.K = 0 if a.mode == "on-policy" else a.replay_updates
        # The cosine's horizon: on-policy steps only, as the paper's code counts them (its replay
        # steps advance the schedule too), or every optimizer step of the run.
        horizon = cfg.train.iterations * (1 if a.lr_horizon == "onpolicy" else 1 + self.K)
        self.policy = Policy(self.model, cfg, self.device, total_steps=horizon)
        self.phase = Phases()
        self.sampling = Sampling(r.temperature, r.top_p, r.top_k)
        self.beta = linear_beta(a.beta, a.beta_end, steps=max(1, a.beta_steps))
        self.drift = DriftTau(a.tau, a.tau_min, a.tau_max, a.drift_ema) if a.tau_auto and a.mode == "freshper" else None
        # Replay changes a priority only if it may still sit at the maximum (a replay sets its
        # own) or is recomputed from a new advantage; otherwise the update is skipped.
        self.insert = buffer_insert(a)
        self.updates_priorities = self.insert != "own" or (
            a.priority == "advantage" and a.replay_advantage == "recompute")
        self.buffer = None
        self.iteration = self.env_steps = self.episodes = 0
        self.sft_losses: list[float] = []
        if resume:
            path = ckpt.latest(self.run_dir / "checkpoints")
            state, self.buffer = ckpt.load(path, self.policy, self.device, self.beta)
            self._check_resumed_buffer()
            self.iteration, self.env_steps, self.episodes = state["iteration"], state["env_steps"], state["episodes"]
            if self.drift is not None and state.get("drift"):
                self.drift.load(state["drift"])
            log.info("resumed from %s (iteration %d, %d env steps)", path, self.iteration, self.env_steps)
        else:
            (self.run_dir / "config.yaml").write_text(to_yaml(cfg))
            if cfg.train.perception_steps:
                self._perception_warm_start()
            if cfg.train.sft_steps:
                log.info("warm start: %d supervised steps on well-formed random actions (teaches the answer format, "
                         "not the task) ...", cfg.train.sft_steps)
            self.sft_losses = self.policy.warm_start(self.tok, self._new_env, cfg.train.sft_steps, cfg.train.sft_lr,
                                                     cfg.train.seed, r.max_new_tokens, r.max_len)
            if self.sft_losses:
                log.info("warm start: %d supervised steps on well-formed *random* actions (format only), "
                         "loss %.3f -> %.3f", len(self.sft_losses), self.sft_losses[0], self.sft_losses[-1])
        if self.buffer is None and self.K > 0:
            self.buffer = ReplayBuffer(a.capacity, mode=a.mode, alpha=a.alpha, beta=self.beta, tau=a.tau, eps=a.eps,
                                       eviction=a.eviction, device=self.device, seed=cfg.train.seed,
                                       insert=self.insert)
        self.engine = make_engine(r.engine, self.model, self.tok, cfg, self.device)
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl", resume_from=self.iteration if resume else None)
        self.resumed = resume

    def _check_resumed_buffer(self) -> None:
        """--resume with buffer settings other than the checkpoint's is an error naming them."""
        a = self.cfg.algo
        if (self.buffer is None) != (self.K == 0):
            raise ValueError(f"--resume: the checkpoint {'has no' if self.buffer is None else 'has a'} replay buffer "
                             f"but algo.mode={a.mode!r}, algo.replay_updates={a.replay_updates} "
                             f"{'needs' if self.K else 'has no use for'} one")
        if self.buffer is None:
            return
        b = self.buffer
        pairs = {"algo.capacity": (b.capacity, a.capacity), "algo.mode": (b.mode, a.mode),
                 "algo.alpha": (b.alpha, a.alpha), "algo.eps": (b.eps, a.eps),
                 "algo.eviction": (b.eviction, a.eviction), "algo.insert_priority": (b.insert, self.insert)}
        if not a.tau_auto:
            pairs["algo.tau"] = (b.tau, a.tau)
        diff = [f"{k} is {have!r} in the checkpoint, {want!r} now" for k, (have, want) in pairs.items() if have != want]
        if diff:
            raise ValueError("--resume with replay-buffer settings that differ from the checkpoint's: "
                             + "; ".join(diff))

    def _perception_warm_start(self) -> None:
        """Reading the board before RL (trainer/perception.py): cached, measured on held-out states."""
        import json

        from . import perception

        t = self.cfg.train
        log.info("perception warm start: %d supervised steps on questions about game states (reading the board, "
                 "not playing: no action, reward or outcome is shown) ...", t.perception_steps)
        losses = perception.warm_start(self.model, self.tok, self._new_env, self.model_path, t.perception_steps,
                                       t.perception_lr, t.seed)
        acc = perception.probe_accuracy(self.model, self.tok, self._new_env)
        log.info("perception: held-out probe accuracy %.3f%s", acc,
                 f" (loss {losses[0]:.3f} -> {losses[-1]:.3f})" if losses else "")
        (self.run_dir / "perception.json").write_text(json.dumps({"steps": t.perception_steps,
                                                                  "probe_accuracy": acc, "losses": losses}))

    def _new_env(self):
        return make_env(self.cfg.env.name, **env_kwargs(self.cfg))

    # --------------------------------------------------------------------------- one iteration
    def _priority(self, reward, adv):
        """Base priority from the environment reward (format penalty excluded) or |advantage|."""
        return base_priority(self.cfg.algo.priority, rewards=reward, advantages=adv[:, None],
                             mask=torch.ones_like(adv[:, None], dtype=torch.bool)).double()

    def _advantages(self, score, group, mask):
        a = self.cfg.algo
        adv = advantages(a.advantage, score, group, std=a.group_std)
        return adv, shape(adv, mask, a.whiten, a.adv_clip)

    def iteration_step(self) -> dict:
        cfg, it, P, dev = self.cfg, self.iteration, self.phase, self.device
        r = cfg.rollout
        groups = r.episodes // r.group_size
        ev = {}
        if cfg.eval.every and it % cfg.eval.every == 0:  # before the rollout: iteration 0 is the untrained policy
            with P("eval"):
                ev = {**self.evaluate(), "eval_env_steps": self.env_steps}
        with P("rollout"):
            self.engine.wake()
            ep = rollout(self.engine, self.tok, cfg.env.name, env_kwargs(cfg), group_seeds(cfg.train.seed, it, groups),
                         r.group_size, r.max_new_tokens, r.max_len, self.sampling, phase=P)
            self.engine.sleep()
        tokens, mask, elogp = ep.tokens.to(dev), ep.mask.to(dev), ep.engine_logp.to(dev)
        score, reward = ep.score.to(dev), ep.reward.to(dev)
        group = (it * groups + ep.group).to(dev)  # unique across iterations, for replay recomputation
        with P("logprob_recompute"):
            old_logp = self.policy.logprobs(tokens, mask)
        mismatch = (old_logp - elogp).abs().masked_fill(~mask, 0).max()
        adv, tok_adv = self._advantages(score, group, mask)
        with P("onpolicy_update"):
            on = self.policy.update(tokens, mask, old_logp, tok_adv, None, elogp)

        replay = {}
        if self.buffer is not None:
            with P("buffer_add"):
                a = cfg.algo
                behaviour = old_logp if a.behaviour_logp == "before" else self.policy.logprobs(tokens, mask)
                self.buffer.add(self._priority(reward, adv), step=it, tokens=tokens.to(torch.int32), mask=mask,
                                old_logp=behaviour, engine_logp=elogp, score=score, reward=reward, group=group,
                                adv=adv)
            replay = self._replay(it)

        with P("weight_sync"):
            sync_s = self.engine.sync_weights(self.model)
        budget = cfg.train.env_step_budget
        last = it + 1 == cfg.train.iterations or (budget and self.env_steps + ep.env_steps >= budget)
        if cfg.eval.every and last:  # and the trained policy, after the last iteration
            with P("eval"):
                ev.update({f"final_{k}": v for k, v in self.evaluate().items()},
                          final_eval_env_steps=self.env_steps + ep.env_steps)

        self.iteration += 1
        self.env_steps += ep.env_steps
        self.episodes += len(ep)
        return {
            "iteration": it, "env_steps": self.env_steps, "episodes": self.episodes,
            "reward": float(ep.reward.mean()), "score": float(ep.score.mean()), "penalty": float(ep.penalty.mean()),
            "success": float(ep.success.float().mean()), "valid_action": float(ep.valid_frac.mean()),
            "turns": float(ep.turns.float().mean()), "context_ended": float(ep.context_ended.float().mean()),
            "gen_tokens": ep.gen_tokens, "loss": on["loss"], "clip_frac": on["clip_frac"],
            "ratio_mean": on["ratio_mean"], "grad_norm": on["grad_norm"], "lr": self.policy.sched.get_last_lr()[0],
            "engine_trainer_logp_maxdiff": float(mismatch), "weight_sync_s": sync_s,
            "buffer_size": len(self.buffer) if self.buffer is not None else 0, **ep.extra, **replay, **ev,
            **{f"time_{k}": round(v, 4) for k, v in P.take().items()},
        }

    def _replay(self, it: int) -> dict:
        a, P = self.cfg.algo, self.phase
        rows = []
        bins = torch.zeros(2, 32, dtype=torch.float64, device=self.device)  # KL sum and count per age bin
        for _ in range(self.K):
            with P("sample"):
                if a.replay_unit == "group":
                    b = self.buffer.sample_groups(a.replay_batch // self.cfg.rollout.group_size, step=it)
                else:
                    b = self.buffer.sample(a.replay_batch, step=it)
            with P("replay_update"):
                if a.replay_advantage == "recompute":
                    adv, tok_adv = self._advantages(b.score, b.group, b.mask)
                else:
                    adv, tok_adv = b.adv, shape(b.adv, b.mask, a.whiten, a.adv_clip)
                st = self.policy.update(b.tokens, b.mask, b.old_logp, tok_adv, b.weights if a.is_weights else None,
                                        b.engine_logp)
            if self.drift is not None:
                self.drift.observe(b.age, st["row_kl"])
            # age bins 0, 1, 2-3, 4-7, ...: bin index = bit length of the age
            k = torch.where(b.age > 0, torch.floor(torch.log2(b.age.double().clamp_min(1))) + 1, 0).long().clamp(max=31)
            bins[0].index_add_(0, k, st["row_kl"].double())
            bins[1].index_add_(0, k, torch.ones_like(k, dtype=torch.float64))
            if self.updates_priorities:
                with P("priority_update"):
                    self.buffer.update_priorities(b.indices, self._priority(b.reward, adv))
            age = b.age.double()
            rows.append(torch.stack([b.ess_fraction, age.mean(), age.max(), st["row_kl"].double().mean(),
                                     st["row_kl1"].double().mean(), *replay_signal(b.group, adv, b.mask)]).cpu())
            rows[-1] = [*rows[-1].tolist(), st["loss"], st["clip_frac"], st["ratio_mean"], len(b)]
        names = ["is_ess", "replay_age_mean", "replay_age_max", "replay_kl", "replay_kl_k1", "replay_singleton_frac",
                 "replay_adv_nonzero_frac", "replay_loss", "replay_clip_frac", "replay_ratio_mean", "replay_rows"]
        out = {n: sum(r[i] for r in rows) / len(rows) for i, n in enumerate(names)}
        out["replay_age_max"] = max(r[2] for r in rows)
        sums, counts = bins.cpu().tolist()
        # {lowest age of the bin: [mean KL(mu || pi) per token, trajectories]}: the KL-vs-age data
        out["replay_kl_by_age"] = {str(0 if i == 0 else 2 ** (i - 1)): [round(sums[i] / counts[i], 6), int(counts[i])]
                                   for i in range(32) if counts[i]}
        if self.drift is not None:
            self.buffer.set_tau(self.drift.update())
            out.update(tau=self.drift.tau, drift_rate=self.drift.rate)
        return out

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Validation: `eval.episodes` fixed initial states (problems) no training iteration uses,
        `eval.samples` = k replies each at `eval.temperature` (0: greedy). eval_success is avg@k
        (the mean over all replies), eval_pass_at_k the share of states solved at least once.
        Its sampling draws from a forked RNG, so evaluating does not change the training run."""
        cfg = self.cfg
        r, e = cfg.rollout, cfg.eval
        seeds = [EVAL_SEED_BASE + i for i in range(e.episodes)]
        cuda = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            self.engine.wake()
            ep = rollout(self.engine, self.tok, cfg.env.name, env_kwargs(cfg), seeds, e.samples, r.max_new_tokens,
                         r.max_len, Sampling(e.temperature, r.top_p, r.top_k))
            self.engine.sleep()
        solved = ep.success.view(e.episodes, e.samples)
        per_state = solved.double().mean(1)  # the states are the independent units of the interval
        half = lambda x: float(1.96 * x.std() / x.numel() ** 0.5) if x.numel() > 1 else float("nan")  # noqa: E731
        return {"eval_success": float(ep.success.float().mean()), "eval_score": float(ep.reward.mean()),
                "eval_success_ci95": half(per_state), "eval_score_ci95": half(ep.reward.view(e.episodes, -1)
                                                                              .double().mean(1)),
                "eval_pass_at_k": float(solved.any(1).float().mean()),
                "eval_valid_action": float(ep.valid_frac.mean()),
                "eval_context_ended": float(ep.context_ended.float().mean()),
                **{f"eval_{k}": v for k, v in ep.extra.items()}}

    # ---------------------------------------------------------------------------------- run
    def save_checkpoint(self) -> Path:
        with self.phase("checkpoint"):
            return ckpt.save(self.run_dir / "checkpoints", self.iteration, self.policy, self.buffer,
                             {"env_steps": self.env_steps, "episodes": self.episodes, "model_path": self.model_path,
                              "drift": self.drift.state() if self.drift is not None else None},
                             self.cfg.train.keep_checkpoints)

    def run(self, iterations: int | None = None, on_iteration=None) -> list[dict]:
        """Train until `train.iterations` (or the env-step budget, or `iterations` more); returns this
        call's metrics rows. `on_iteration(i)` may return a context manager wrapped around iteration i
        (the profiler uses it). SIGINT or SIGTERM finishes the iteration in progress, writes a
        checkpoint and returns (a second SIGINT aborts at once); `self.interrupted` says so."""
        import time

        cfg = self.cfg
        end = cfg.train.iterations if iterations is None else min(cfg.train.iterations, self.iteration + iterations)
        bar = None
        if cfg.train.progress:
            from tqdm import tqdm

            bar = tqdm(total=cfg.train.iterations, initial=self.iteration, desc=self.run_dir.name, dynamic_ncols=True)
        rows = []
        every = max(1, (end - self.iteration) // 20)  # about twenty progress lines per run in train.log
        t0 = time.perf_counter()
        self.interrupted = False
        self.trackers = Trackers(self.tracker_names, self.run_dir, cfg.to_dict(), self.resumed or self.iteration > 0)
        with _stop_on_signals(self), _closing(self.trackers):
            while self.iteration < end and not self.interrupted:
                if cfg.train.env_step_budget and self.env_steps >= cfg.train.env_step_budget:
                    log.info("env-step budget %d reached at iteration %d", cfg.train.env_step_budget, self.iteration)
                    break
                ctx = on_iteration(self.iteration) if on_iteration else nullcontext()
                with ctx:
                    row = self.iteration_step()
                self.metrics.write(row)
                self.trackers.write(row)
                rows.append(row)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(reward=f"{row['reward']:.2f}", success=f"{row['success']:.2f}",
                                    env_steps=row["env_steps"])
                if bar is None or row["iteration"] % every == 0 or "eval_success" in row:
                    log.info("%s", progress_line(row))
                if self.iteration % cfg.train.checkpoint_every == 0:
                    self.save_checkpoint()
        if bar is not None:
            bar.close()
        if rows and self.iteration % cfg.train.checkpoint_every:  # the end, if not just saved
            self.save_checkpoint()
        try:
            png = plot(self.run_dir)
        except ValueError:
            png = None
        if rows and not self.interrupted and (self.iteration >= cfg.train.iterations or (
                cfg.train.env_step_budget and self.env_steps >= cfg.train.env_step_budget)):
            from .export import save_hf

            final = save_hf(self.model, self.tok, self.run_dir / "final")
            log.info("trained policy as a Hugging Face folder: %s", final)
        if self.interrupted:
            log.info("interrupted at iteration %d; resume with: freshper train --resume %s", self.iteration,
                     self.run_dir)
        elif rows:
            log.info("%s", summary(rows, self.iteration, self.env_steps, time.perf_counter() - t0, self.run_dir, png,
                                   cfg.eval.episodes * cfg.eval.samples))
        return rows


def progress_line(row: dict) -> str:
    """One line of a run's progress for train.log."""
    line = (f"iter {row['iteration']}  env_steps {row['env_steps']}  reward {row['reward']:.3f}  "
            f"success {row['success']:.3f}  loss {row['loss']:.4f}")
    if "replay_singleton_frac" in row:
        line += f"  replay age {row['replay_age_mean']:.1f}  singletons {row['replay_singleton_frac']:.2f}"
    for key in ("eval_success", "final_eval_success"):
        if key in row:
            line += f"  {key} {row[key]:.3f}"
    return line


def _interval(p: float, n: int) -> float:
    """Half-width of the 95% normal interval of a success rate p over n episodes."""
    return 1.96 * (p * (1 - p) / max(n, 1)) ** 0.5


def summary(rows: list[dict], iterations: int, env_steps: int, seconds: float, run_dir: Path, png, n_eval: int) -> str:
    """The closing lines of a run: what was trained, the final and best validation, where things are."""
    lines = [f"done: {iterations} iterations, {env_steps} env steps, {seconds / 60:.1f} min wall"]
    evals = [(r["iteration"], r["eval_success"]) for r in rows if "eval_success" in r]
    final = rows[-1].get("final_eval_success")
    if final is not None:
        lines.append(f"final eval success {final:.3f} ± {_interval(final, n_eval):.3f} (95%, {n_eval} episodes)")
    if evals:
        it, best = max(evals, key=lambda e: e[1])
        lines.append(f"best eval success {best:.3f} ± {_interval(best, n_eval):.3f} (before iteration {it})")
    lines.append(f"outputs: {run_dir}/metrics.jsonl, {png or 'no plot'}, {run_dir}/checkpoints")
    return "\n  ".join(lines)


class _closing:
    """Close the trackers however the loop ends (flushes TensorBoard, finishes the W&B run)."""

    def __init__(self, trackers):
        self.trackers = trackers

    def __enter__(self):
        return self.trackers

    def __exit__(self, *exc):
        self.trackers.close()
        return False


class _stop_on_signals:
    """While training: the first SIGINT or SIGTERM asks the loop to stop after the iteration in
    progress (the state stays consistent, so the checkpoint resumes exactly); a second SIGINT
    raises KeyboardInterrupt. Only in the main thread, where Python delivers signals."""

    def __init__(self, trainer):
        self.trainer = trainer

    def __enter__(self):
        import signal
        import threading

        self.saved = {}
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.saved[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        import signal

        if self.trainer.interrupted and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.trainer.interrupted = True
        log.warning("%s: finishing iteration %d, then writing a checkpoint (Ctrl-C again to abort without one)",
                    signal.Signals(signum).name, self.trainer.iteration)

    def __exit__(self, *exc):
        import signal

        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
        return False
