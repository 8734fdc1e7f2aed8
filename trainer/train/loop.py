"""The training loop: one iteration is

    rollout (engine.generate <-> env.step, one chat per episode) -> advantages
    -> on-policy update (algo.onpolicy_passes optimizer steps) -> buffer.add
    -> K x [sample -> replay update -> priority update] -> weight sync to the engine
    -> (every eval.every iterations) validation rollout -> (every k iterations) checkpoint

The arm is `algo.mode`: on-policy (K = 0), per (no decay), freshper (exp(-age / tau) decay),
uniform (replay without priorities). The buffer's step is the iteration number, so tau is in
iterations, as in the paper. The old policy's log-probs of a fresh batch are those the on-policy
update's first forward computes before its optimizer step, so no separate forward recomputes them
(TRL does the same when it trains once on each batch); further passes (algo.onpolicy_passes) and
algo.behaviour_logp after use those, or a forward after the update. Episodes stay on the
training device from the rollout to the buffer and back; each update syncs with the host once
for its statistics.

On several ranks (torchrun) each rank rolls out its share of the iteration's groups, keeps them
in its own buffer and draws its share of each replay batch from the one global FreshPER
distribution (freshper.distributed); the model is sharded (trainer/model/policy.py). Counters, stop
requests, drift estimates and metrics are agreed over the ranks; rank 0 writes the run folder.
"""
from __future__ import annotations

import logging
from contextlib import closing, contextmanager, nullcontext
from pathlib import Path

import torch

from freshper import ReplayBuffer, base_priority, linear_beta
from freshper.buffer import ess_fraction
from freshper.distributed import DistributedSampler
from freshper.profiling.nvtx import Phases

from ..config import Config, buffer_insert, env_kwargs, parse_lag_probs, sft_steps, to_yaml, warm_start_seed
from ..dist import RANK_SEED_STRIDE, SINGLE, Dist, check_world, rank0_first
from ..engines import Sampling, make_engine
from ..envs import make_env
from ..envs.base import EVAL_SEED_BASE
from ..model.load import load_image_processor, load_policy, pick_device, record_dtype
from ..model.policy import Policy
from ..model.precision import compute_dtype
from . import checkpoint as ckpt
from .advantages import advantages, shape
from .async_worker import AsyncBatches, GenerationWorkerDied
from .batches import LockstepBatches
from .console import on_terminal, progress_line, stop_on_signals, summary
from .drift import DriftTau
from .intervals import mean_ci, rate_ci
from .lags import LagSchedule
from .metrics import MetricsLog, merge_rows, plot
from .replay_signal import REPLAY_ROW_COLUMNS, replay_signal, rollout_signal, signal_rows
from .rollout import Episodes, rollout
from .seeding import group_seeds, make_deterministic, seed_everything
from .staleness import treat
from .trackers import Trackers
from .trackers import check_installed as check_trackers
from .trackers import parse as parse_trackers
from .warm_start import cache_path, cached_warm_start, warm_start
from .warm_start import settings as ws_settings

log = logging.getLogger("freshper")


class Trainer:
    """One run: `Trainer(cfg, run_dir).run()`. One attribute is not in the config:
    `recompute_old_logp` (default False) runs a separate forward for the behaviour log-probs
    before the on-policy update instead of taking them from the update's first forward (the same
    numbers, one forward more): a check of that equality (tests/trainer/model/test_update_passes.py)."""

    _engine_behind = False  # the engine's weights are older than the policy's (rollout.asynchronous)

    def __init__(self, cfg: Config, run_dir: Path, resume: bool = False, dist: Dist = SINGLE):
        self.cfg, self.run_dir, self.dist = cfg, Path(run_dir), dist
        check_world(cfg, dist.world)
        self.tracker_names = parse_trackers(cfg.train.log_to) if dist.main else []
        check_trackers(self.tracker_names)  # a missing extra stops the start, before a model is built
        make_env(cfg.env.name, **env_kwargs(cfg))  # its options (env.reward's form, held-out folds) fail now
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        if cfg.train.deterministic:
            make_deterministic()
        self.device = pick_device(cfg)
        if self.device.type == "cuda" and dist.on:
            self.device = torch.device("cuda", dist.local_rank)
        cfg = self.cfg = record_dtype(cfg, self.device, self.run_dir if resume else None)  # `auto` resolved, kept
        with rank0_first(dist):  # the tiny model's cache is written once
            self.model, self.tok, self.model_path = load_policy(cfg, self.device)
        self.processor = load_image_processor(cfg, self.model_path)  # a VLM's (None for text environments)
        # Seeded after the model exists: building it on a cold cache, or loading it from a warm
        # one, must not decide the sampling streams, so a run is a function of (config, seed).
        seed_everything(cfg.train.seed)
        self.K = 0 if cfg.algo.mode == "on-policy" else cfg.algo.replay_updates
        self.recompute_old_logp = False  # True: a separate forward for the old log-probs (tests hold it equal)
        self.sft_losses: list[float] = []
        if not resume:  # warm starts run on the whole model, identically on every rank, before sharding
            if dist.main:
                (self.run_dir / "config.yaml").write_text(to_yaml(cfg))
            self._warm_starts()
        gen_model = self._make_policy()
        if dist.on:  # each rank samples its own episodes: its own streams (rank 0's are a single run's)
            seed_everything(cfg.train.seed + RANK_SEED_STRIDE * dist.rank)
        self.phase = Phases()
        r = cfg.rollout
        self.sampling = Sampling(r.temperature, r.top_p, r.top_k)
        self._make_replay(resume)
        self.engine = make_engine(r.engine, gen_model, self.tok, cfg, self.device, model_path=self.model_path)
        if gen_model is not self.model:
            self.engine.sync_weights(self.model)
        self.metrics = (MetricsLog(self.run_dir / "metrics.jsonl", resume_from=self.iteration if resume else None)
                        if dist.main else None)
        self.resumed = resume
        if dist.main:
            from .provenance import record

            record(self.run_dir, resume)
        if resume and dist.main:  # the checkpoint accepted them: overrides given at resume are the run's config now
            (self.run_dir / "config.yaml").write_text(to_yaml(cfg))

    def _warm_starts(self) -> None:
        """The perception and format warm starts a new run begins with (train.perception_steps,
        train.sft_steps; both off for a pretrained model by default)."""
        cfg, r = self.cfg, self.cfg.rollout
        if cfg.train.perception_steps:
            with rank0_first(self.dist):
                self._perception_warm_start()
        steps, t = sft_steps(cfg), cfg.train
        path = cache_path(self.model_path, ws_settings(cfg, self.model, steps)) if steps and t.sft_cache else None
        self.sft_losses, cached = cached_warm_start(path, self.model, lambda: warm_start(
            self.model, self.tok, self._new_env, steps, t.sft_lr, warm_start_seed(cfg), r.max_new_tokens, r.max_len,
            processor=self.processor, micro_batch=cfg.algo.micro_batch, replies=t.sft_replies))
        if self.sft_losses:
            what = "well-formed *random* actions (format only)" if t.sft_replies == "random" else "the solver's moves"
            log.info("warm start: %d supervised steps on %s, loss %.3f -> %.3f%s", len(self.sft_losses), what,
                     self.sft_losses[0], self.sft_losses[-1], f" (cached: {path})" if cached else "")
        seed_everything(t.seed)  # the run's streams are the same whether the warm start ran or was loaded

    def _make_policy(self):
        """self.policy (sharded on several ranks) and the model the engine generates with: the
        policy's own, or on several ranks with the HF engine a whole copy kept by sync_weights."""
        cfg, dist, a = self.cfg, self.dist, self.cfg.algo
        gen_model, compute = self.model, None
        if dist.on:
            import copy

            from ..model.sharding import broadcast_weights

            broadcast_weights(self.model)
            compute = compute_dtype(self.model)  # FSDP2 casts to it (float32 master shards) instead of autocast
            if cfg.rollout.engine == "hf":  # generation needs whole weights: a copy, refreshed by sync_weights
                gen_model = copy.deepcopy(self.model).eval().requires_grad_(False)
                if compute is not None:  # frozen: stored in the compute dtype, no masters
                    gen_model.to(compute)
            if compute is not None:  # a LoRA run's frozen base too: FSDP2 shards one dtype
                self.model.float()
        # The cosine's horizon: on-policy steps only, as the paper's code counts them (its replay
        # steps advance the schedule too), or every optimizer step of the run.
        horizon = cfg.train.iterations * (1 if a.lr_horizon == "onpolicy" else a.onpolicy_passes + self.K)
        excluded = stand_in = None
        if self.processor is not None:  # the engine never samples vision tokens (a reply cannot hold an image)
            from ..model.vision import stand_in_row, suppressed_ids

            excluded = suppressed_ids(self.tok)
            stand_in = stand_in_row(self.tok, self.processor) if dist.on else None
        self.policy = Policy(self.model, cfg, self.device, total_steps=horizon, dist=dist, compute_dtype=compute,
                             exclude_ids=excluded, stand_in=stand_in)
        self.model = self.policy.model
        return gen_model

    def _make_replay(self, resume: bool) -> None:
        """The replay side: beta schedule, drift tau, insertion rule, the buffer (restored with
        the rest of the checkpoint on resume) and, on several ranks, the global sampler."""
        cfg, dist, a = self.cfg, self.dist, self.cfg.algo
        self.beta = linear_beta(a.beta, a.beta_end, steps=max(1, a.beta_steps))
        self.drift = DriftTau(a.tau, a.tau_min, a.tau_max, a.drift_ema) if a.tau_auto and a.mode == "freshper" else None
        # Replay changes a priority only if it may still sit at the maximum (a replay sets its
        # own) or is recomputed from a new advantage; otherwise the update is skipped.
        self.insert = buffer_insert(a)
        self.updates_priorities = self.insert != "own" or (
            a.priority == "advantage" and a.replay_advantage == "recompute")
        self.buffer = self.sampler = None
        r = cfg.rollout
        lags = LagSchedule(cfg.train.seed, r.lag, parse_lag_probs(r.lag_probs))
        self.batches = LockstepBatches(lags, self._rollout, cfg.train.iterations)  # batches generated ahead
        self.iteration = self.env_steps = self.episodes = self.dropped = 0
        sampler_rng = None
        if resume:
            sampler_rng = self._restore()
        if self.buffer is None and self.K > 0:
            sync_free = {"auto": None, "on": True, "off": False}[a.buffer_sync_free]
            self.buffer = ReplayBuffer(a.capacity // dist.world, mode=a.mode, alpha=a.alpha, beta=self.beta, tau=a.tau,
                                       eps=a.eps, eviction=a.eviction, device=self.device,
                                       seed=cfg.train.seed + dist.rank, insert=self.insert, sync_free=sync_free,
                                       sampler="scan" if sync_free and self.device.type == "cpu" else "auto")
        if self.buffer is not None and dist.on:
            self.sampler = DistributedSampler(self.buffer, seed=cfg.train.seed)
            if sampler_rng is not None:
                self.sampler.gen.set_state(sampler_rng)

    def _restore(self):
        """Load the latest checkpoint into the policy, buffer, counters, drift and pending batch;
        returns the distributed sampler's RNG state (or None)."""
        cfg, dist = self.cfg, self.dist
        path = ckpt.latest(self.run_dir / "checkpoints")
        state, self.buffer, sampler_rng = ckpt.load(path, self.policy, self.device, self.beta, dist)
        self._check_resumed_buffer()
        self.iteration, self.env_steps, self.episodes = state["iteration"], state["env_steps"], state["episodes"]
        self.dropped = state.get("dropped", 0)
        self.batches.load(ckpt.load_pending(path, dist), self.iteration)
        if self.drift is not None and state.get("drift"):
            self.drift.load(state["drift"])
        if state.get("world_size", 1) != dist.world:
            # the ranks' sampling streams cannot continue the old ones: new ones, fixed by (seed, iteration)
            seed_everything(cfg.train.seed + RANK_SEED_STRIDE * dist.rank + 15_485_863 * self.iteration)
        log.info("resumed from %s (iteration %d, %d env steps, saved by %d rank(s), resumed by %d)", path,
                 self.iteration, self.env_steps, state.get("world_size", 1), dist.world)
        return sampler_rng

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
        pairs = {"algo.capacity": (b.capacity * self.dist.world, a.capacity), "algo.mode": (b.mode, a.mode),
                 "algo.alpha": (b.alpha, a.alpha), "algo.eps": (b.eps, a.eps),
                 "algo.eviction": (b.eviction, a.eviction), "algo.insert_priority": (b.insert, self.insert)}
        if not a.tau_auto:
            pairs["algo.tau"] = (b.tau, a.tau)
        diff = [f"{k} is {have!r} in the checkpoint, {want!r} now" for k, (have, want) in pairs.items() if have != want]
        if diff:
            raise ValueError("--resume with replay-buffer settings that differ from the checkpoint's: "
                             + "; ".join(diff))

    def _perception_warm_start(self) -> None:
        """Reading the board before RL (trainer/train/perception.py): cached, measured on held-out states."""
        import json

        from . import perception

        t = self.cfg.train
        log.info("perception warm start: %d supervised steps on questions about game states (reading the board, "
                 "not playing: no action, reward or outcome is shown) ...", t.perception_steps)
        losses = perception.warm_start(self.model, self.tok, self._new_env, self.model_path, t.perception_steps,
                                       t.perception_lr, warm_start_seed(self.cfg))
        acc = perception.probe_accuracy(self.model, self.tok, self._new_env)
        log.info("perception: held-out probe accuracy %.3f%s", acc,
                 f" (loss {losses[0]:.3f} -> {losses[-1]:.3f})" if losses else "")
        if self.dist.main:
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
        """(E,) episode advantages and their (E, L) token advantages, shaped."""
        a = self.cfg.algo
        adv = advantages(a.advantage, score, group, std=a.group_std, total=self.dist.sum)
        return adv, self._shape(adv, mask)

    def _shape(self, adv, mask):
        a = self.cfg.algo
        return shape(adv, mask, a.whiten, a.adv_clip, total=self.dist.sum)

    def _engine_check(self, old_logp, elogp, mask) -> dict:
        """How the engine's recorded log-probs compare with the trainer's recompute. Under
        unprocessed sampling (temperature 1, top_k 0, top_p 1) both are of the model's own
        distribution: `engine_trainer_logp_maxdiff` is then their largest difference, a numerical
        check (kv cache, kernels, a stale weight sync), and `engine_trainer_logp_meanabs` the mean
        absolute difference per response token (under bf16, the mismatch an on-policy ratio sees,
        followed over a run). Otherwise the engine's are of the processed
        distribution it sampled from (its behaviour policy, used by truncated IS) and the trainer's
        of the model's (the ratio's old policy): they differ by design, so the row reports
        `sampling_logp_gap` instead, the mean over response tokens of engine minus trainer
        log-prob (the log-mass that temperature and the top-k / top-p filters move), in nats."""
        d = (elogp - old_logp).masked_fill(~mask, 0)
        if self.sampling == Sampling(1.0, 1.0, 0):
            total = self.dist.sum(torch.stack([d.abs().sum().double(), mask.sum().double()]))
            return {"engine_trainer_logp_maxdiff": float(d.abs().max()),
                    "engine_trainer_logp_meanabs": float(total[0] / total[1].clamp_min(1))}
        total = self.dist.sum(torch.stack([d.sum().double(), mask.sum().double()]))
        return {"sampling_logp_gap": float(total[0] / total[1].clamp_min(1))}

    def _my_groups(self, it: int) -> tuple[list[int], int]:
        """(initial states of this rank's groups this iteration, index of its first group)."""
        r, d = self.cfg.rollout, self.dist
        groups = r.episodes // r.group_size
        share = groups // d.world
        return group_seeds(self.cfg.train.seed, it, groups)[d.rank * share:(d.rank + 1) * share], d.rank * share

    def _finished(self, iterations: int, env_steps: int) -> bool:
        """Whether a run that has done `iterations` and spent `env_steps` is at its end: the last
        iteration (train.iterations) or the env-step budget (train.env_step_budget, 0: none)."""
        t = self.cfg.train
        return iterations >= t.iterations or bool(t.env_step_budget and env_steps >= t.env_step_budget)

    def _rollout(self, it: int) -> Episodes:
        """This rank's episodes of iteration `it`'s groups, with the engine's current weights."""
        r = self.cfg.rollout
        seeds, _ = self._my_groups(it)
        return rollout(self.engine, self.tok, self.cfg.env.name, env_kwargs(self.cfg), seeds, r.group_size,
                       r.max_new_tokens, r.max_len, self.sampling, phase=self.phase, processor=self.processor)

    def iteration_step(self) -> dict:
        cfg, it, P = self.cfg, self.iteration, self.phase
        r = cfg.rollout
        groups = r.episodes // r.group_size
        ev = {}
        if cfg.eval.every and it % cfg.eval.every == 0:  # before the rollout: iteration 0 is the untrained policy
            with P("eval"):
                ev = {**self.evaluate(), "eval_env_steps": self.env_steps}
        _, first = self._my_groups(it)
        here = not isinstance(self.batches, AsyncBatches)  # else the worker generates, and this engine validates
        with P("rollout"):
            if here:
                self.engine.wake()
            made = self.batches.generated
            batch = self.batches.take(it)
            ep = batch.episodes
            env_steps, episodes = (int(x) for x in self.dist.sum(torch.tensor([ep.env_steps, len(ep)])))
            last = self._finished(it + 1, self.env_steps + env_steps)
            if not last:  # the batches these weights generate for later iterations (lag > 0)
                self.batches.ahead(it)
            generated = self.batches.generated - made
            if here:
                self.engine.sleep()
        a = cfg.algo
        how = treat(a.staleness, it, batch.version, tau=self.drift.tau if self.drift is not None else a.tau,
                    max_age=a.stale_max_age, stale_tis_cap=a.stale_tis_cap)
        batch_lag = how.age  # versions between this batch's weights and these
        staleness = {"batch_age": how.age, "batch_weight": how.weight,
                     "episodes_generated": generated * self.dist.world, "episodes_dropped": 0 if how.keep else episodes,
                     "episodes_in_flight": self.batches.in_flight() * self.dist.world, **self._worker_times()}
        self.dropped += 0 if how.keep else episodes  # the gate: generation wasted; replay updates still run
        # every reply failed to score: a scorer bug, not a policy (agreed over the ranks: all stop together)
        if self.dist.flag(ep.extra.get("score_errors", 0.0) == 1.0):
            raise RuntimeError(f"iteration {it}: the scorer raised on every one of the {len(ep)} replies (the first "
                               f"error is logged above); stopping instead of training on zero reward")
        on, stats = self._train_on(batch, how, it * groups + first) if how.keep else ({}, {})
        replay = {}
        if self.buffer is not None:
            replay = self._replay(it)

        with P("weight_sync"):
            if here:
                sync_s = self.engine.sync_weights(self.model)
            else:  # the worker's next batches use these weights; this engine gets them before a validation
                sync_s = self.batches.publish(self.model, it + 1)
                self._engine_behind = True
        if cfg.eval.every and last:  # and the trained policy, after the last iteration
            with P("eval"):
                ev.update({f"final_{k}": v for k, v in self.evaluate().items()},
                          final_eval_env_steps=self.env_steps + env_steps)

        self.iteration += 1
        self.env_steps += env_steps
        self.episodes += episodes
        row = {
            "iteration": it, "env_steps": self.env_steps, "episodes": self.episodes, "world_size": self.dist.world,
            "reward": float(ep.reward.mean()), "score": float(ep.score.mean()), "penalty": float(ep.penalty.mean()),
            "success": float(ep.success.float().mean()), "valid_action": float(ep.valid_frac.mean()),
            "turns": float(ep.turns.float().mean()), "context_ended": float(ep.context_ended.float().mean()),
            "gen_tokens": ep.gen_tokens, "rollout_lag": batch_lag, **staleness, "episodes_dropped_total": self.dropped,
            **{k: on[k] for k in ("loss", "clip_frac", "ratio_mean", "grad_norm") if k in on},
            "lr": self.policy.sched.get_last_lr()[0], **stats, "weight_sync_s": sync_s,
            "updates": self.policy.sched.last_epoch, **self.policy.scale_stats(),
            "buffer_size": len(self.buffer) if self.buffer is not None else 0, **ep.extra, **replay, **ev,
            **{f"time_{k}": round(v, 4) for k, v in P.take().items()},
        }
        return merge_rows(self.dist.objects(row)) if self.dist.on else row

    def _train_on(self, batch, how, group0: int) -> tuple[dict, dict]:
        """The on-policy update(s) on one batch, treated as `how` says (its staleness), and its
        entry into the buffer; returns the first update's statistics and the rest of its row.
        `group0`: the first group id of this rank's batch (ids unique across iterations and ranks)."""
        cfg, P, dev, ep, it = self.cfg, self.phase, self.device, batch.episodes, batch.iteration
        tokens, mask, elogp = ep.tokens.to(dev), ep.mask.to(dev), ep.engine_logp.to(dev)
        score, reward = ep.score.to(dev), ep.reward.to(dev)
        group = (group0 + ep.group).to(dev)
        old_logp = None  # the update's first forward gives the log-probs under these weights
        if self.recompute_old_logp:  # the separate forward, as before the cut: the same numbers
            with P("logprob_recompute"):
                old_logp = self.policy.logprobs(tokens, mask, vision=ep.vision)
        adv, tok_adv = self._advantages(score, group, mask)
        step = {"tis_cap": how.tis_cap, "batch_weight": how.weight, "ess_lr": how.ess_lr}  # its staleness
        with P("onpolicy_update"):
            on = self.policy.update(tokens, mask, old_logp, tok_adv, None, elogp, vision=ep.vision, **step)
            if old_logp is None:
                old_logp = on.pop("logp")
            passes = [self.policy.update(tokens, mask, old_logp, tok_adv, None, elogp, vision=ep.vision, **step)
                      for _ in range(cfg.algo.onpolicy_passes - 1)]
        row = {**rollout_signal(score, group, mask, elogp), **self._engine_check(old_logp, elogp, mask)}
        if how.ess_lr:  # the first pass's: the ESS of the importance ratios and the learning-rate factor it gave
            row.update(batch_ess=on["ess"], batch_lr_scale=on["lr_scale"])
        if passes:  # the further passes over the fresh batch: how far they moved from its old policy
            row.update({f"pass_{k}": sum(p[k] for p in passes) / len(passes)
                        for k in ("loss", "clip_frac", "ratio_mean", "kl_mean")})
        if self.buffer is None:
            return on, row
        with P("buffer_add"):
            a = cfg.algo
            behaviour = (old_logp if a.behaviour_logp == "before"
                         else self.policy.logprobs(tokens, mask, vision=ep.vision))
            optional = {}  # the fields some runs store: a VLM's images, the rollout lag
            if ep.pngs is not None:  # a VLM's images travel as PNG bytes: exact, and ~1% of the pixels' size
                from freshper.images import pack_pngs

                optional["images"] = pack_pngs(ep.pngs, cfg.rollout.image_bytes).to(dev)
            names = self.buffer.field_names
            if not names or "gen_lag" in names:  # a buffer resumed from before gen_lag goes on without it
                # versions between the weights that made it and its birth (0 where it is born at them)
                optional["gen_lag"] = torch.full((len(ep),), how.birth - batch.version, dtype=torch.int8, device=dev)
            if how.birth != it:  # born at the weights that made it: replay decays it from there
                optional["birth"] = how.birth
            self.buffer.add(self._priority(reward, adv), step=it, tokens=tokens.to(torch.int32), mask=mask,
                            old_logp=behaviour, engine_logp=elogp, score=score, reward=reward, group=group,
                            adv=adv, **optional)
        return on, row

    def _replay(self, it: int) -> dict:
        a, P = self.cfg.algo, self.phase
        rows = []
        bins = torch.zeros(2, 32, dtype=torch.float64, device=self.device)  # KL sum and count per age bin
        by_gen_age: dict[int, list[float]] = {}  # generation age -> [rows, KL sum, IS-weight sum]
        if a.max_age:  # the replay age limit: nothing older than max_age iterations is replayed
            with P("sample"):
                self.buffer.evict_older_than(it - a.max_age)
        for _ in range(self.K):
            with P("sample"):
                if a.replay_unit == "group":
                    b = self.buffer.sample_groups(a.replay_batch // self.cfg.rollout.group_size, step=it)
                elif self.sampler is not None:  # this rank's share of the global draw
                    b = self.sampler.sample(a.replay_batch, step=it)
                else:
                    b = self.buffer.sample(a.replay_batch, step=it)
            with P("replay_update"):
                if a.replay_advantage == "recompute":
                    adv, tok_adv = self._advantages(b.score, b.group, b.mask)
                else:
                    adv, tok_adv = b.adv, self._shape(b.adv, b.mask)
                st = self.policy.update(b.tokens, b.mask, b.old_logp, tok_adv, b.weights if a.is_weights else None,
                                        b.engine_logp, vision=self._replayed_images(b))
            # per replayed row, gathered over the ranks: what the batch-level statistics need
            # the age since the weights that generated it (older checkpoints kept no gen_lag: 0)
            gen_age = b.age.double() + (b.gen_lag.double() if "gen_lag" in b.fields else 0.0)
            per_row = self.dist.cat(torch.cat([torch.stack([b.weights.double(), b.age.double(),
                                                            st["row_kl"].double(), st["row_kl1"].double(),
                                                            gen_age], 1),
                                               signal_rows(b.group, adv, b.mask)], 1))
            col = dict(zip(REPLAY_ROW_COLUMNS, per_row[:, :len(REPLAY_ROW_COLUMNS)].T))
            age, kl = col["age"], col["kl"]
            if self.drift is not None:
                self.drift.observe(age, kl)
            # age bins 0, 1, 2-3, 4-7, ...: bin index = bit length of the age
            k = torch.where(age > 0, torch.floor(torch.log2(age.clamp_min(1))) + 1, 0).long().clamp(max=31)
            bins[0].index_add_(0, k, kl)
            bins[1].index_add_(0, k, torch.ones_like(kl))
            if self.updates_priorities and len(b):  # on several ranks a rank may draw no row
                with P("priority_update"):
                    self.buffer.update_priorities(b.indices, self._priority(b.reward, adv))
            singletons, adv_nonzero = replay_signal(per_row[:, len(REPLAY_ROW_COLUMNS):])
            n = per_row.shape[0]
            # one transfer: the batch's statistics, then each row's generation age, KL and IS weight
            flat = torch.cat([torch.stack([ess_fraction(col["weight"]), age.mean(), age.max(), kl.mean(),
                                           col["kl_k1"].mean(), singletons, adv_nonzero, col["gen_age"].mean(),
                                           col["gen_age"].max()]),
                              col["gen_age"], kl, col["weight"]]).tolist()
            stats = flat[:9]
            for g, k_, w in zip(flat[9:9 + n], flat[9 + n:9 + 2 * n], flat[9 + 2 * n:]):
                acc = by_gen_age.setdefault(int(g), [0, 0.0, 0.0])
                acc[0] += 1
                acc[1] += k_
                acc[2] += w
            self.buffer.check()  # a sync-free buffer's deferred input errors, read right after this sync
            rows.append({"is_ess": stats[0], "replay_age_mean": stats[1], "replay_age_max": stats[2],
                         "replay_gen_age_mean": stats[7], "replay_gen_age_max": stats[8],
                         "replay_kl": stats[3], "replay_kl_k1": stats[4], "replay_singleton_frac": stats[5],
                         "replay_adv_nonzero_frac": stats[6], "replay_loss": st["loss"],
                         "replay_clip_frac": st["clip_frac"], "replay_ratio_mean": st["ratio_mean"],
                         "replay_grad_norm": st["grad_norm"],  # before the clip, as grad_norm is
                         "replay_rows": per_row.shape[0]})
        out = {n: sum(r[n] for r in rows) / len(rows) for n in rows[0]}
        out["replay_age_max"] = max(r["replay_age_max"] for r in rows)
        out["replay_gen_age_max"] = max(r["replay_gen_age_max"] for r in rows)
        sums, counts = bins.cpu().tolist()
        # {lowest age of the bin: [mean KL(mu || pi) per token, trajectories]}: the KL-vs-age data
        out["replay_kl_by_age"] = {str(0 if i == 0 else 2 ** (i - 1)): [round(sums[i] / counts[i], 6), int(counts[i])]
                                   for i in range(32) if counts[i]}
        # {versions since the generating weights: [trajectories, mean KL(mu || pi) per token, mean IS weight]}:
        # what replay drew by age, exactly (replay_kl_by_age bins the buffer age in powers of two)
        out["replay_by_gen_age"] = {str(g): [c, round(k_ / c, 6), round(w / c, 6)]
                                    for g, (c, k_, w) in sorted(by_gen_age.items())}
        if self.drift is not None:
            self.buffer.set_tau(self.drift.update())
            out.update(tau=self.drift.tau, drift_rate=self.drift.rate)
        return out

    def _replayed_images(self, b):
        """A replay batch's images, decoded from the PNG bytes the buffer keeps (None: text env)."""
        if "images" not in b.fields:
            return None
        from freshper.images import unpack_pngs

        from ..model.vision import VisionRows

        return VisionRows.from_pngs(self.processor, unpack_pngs(b.images),
                                    self.tok.convert_tokens_to_ids("<|image_pad|>"))

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Validation: `eval.episodes` fixed initial states (problems) no training iteration uses,
        `eval.samples` = k replies each at `eval.temperature` (0: greedy). eval_success is avg@k
        (the mean over all replies), eval_pass_at_k the share of states solved at least once.
        Its sampling draws from a forked RNG, so evaluating does not change the training run.
        On several ranks each plays its share of the states; the figures are over all of them."""
        cfg, d = self.cfg, self.dist
        r, e = cfg.rollout, cfg.eval
        share = e.episodes // d.world
        seeds = [EVAL_SEED_BASE + d.rank * share + i for i in range(share)]
        cuda = [self.device] if self.device.type == "cuda" else []
        chunk = e.batch or share  # states played at once: their key/value caches are the validation's peak memory
        parts, sums = [], {}
        if self._engine_behind:  # rollout.asynchronous: synced for a validation, not after every update
            self.engine.sync_weights(self.model)
            self._engine_behind = False
        with torch.random.fork_rng(devices=cuda):
            self.engine.wake()
            for i in range(0, share, chunk):
                ep = rollout(self.engine, self.tok, cfg.env.name, env_kwargs(cfg), seeds[i:i + chunk], e.samples,
                             r.max_new_tokens, r.max_len, Sampling(e.temperature, r.top_p, r.top_k),
                             processor=self.processor)
                parts.append(torch.stack([ep.success.double(), ep.reward.double(), ep.valid_frac.double(),
                                          ep.context_ended.double()], 1))
                for k, v in ep.extra.items():  # per-episode means, weighted back to the whole share
                    sums[k] = sums.get(k, 0.0) + v * len(ep)
            self.engine.sleep()
        # (states, samples) per column: success, reward, valid share, context ended; all ranks' states
        t = d.cat(torch.cat(parts).view(share, e.samples, 4))
        solved, reward = t[..., 0], t[..., 1]
        per_state = solved.mean(1)  # the states are the independent units of the interval
        # equal shares: the mean of the ranks' means
        extras = d.objects({k: v / (share * e.samples) for k, v in sums.items()})
        return {"eval_success": float(solved.mean()), "eval_score": float(reward.mean()),
                "eval_success_ci95": rate_ci(per_state.tolist())[1],
                "eval_score_ci95": mean_ci(reward.mean(1).tolist())[1],
                "eval_pass_at_k": float((solved > 0).any(1).double().mean()),
                "eval_valid_action": float(t[..., 2].mean()),
                "eval_context_ended": float(t[..., 3].mean()),
                **{f"eval_{k}": sum(x[k] for x in extras) / len(extras) for k in ep.extra}}

    # ---------------------------------------------------------------------------------- run
    def save_checkpoint(self) -> Path:
        with self.phase("checkpoint"):
            return ckpt.save(self.run_dir / "checkpoints", self.iteration, self.policy, self.buffer,
                             {"env_steps": self.env_steps, "episodes": self.episodes, "model_path": self.model_path,
                              "drift": self.drift.state() if self.drift is not None else None,
                              "dropped": self.dropped},
                             self.cfg.train.keep_checkpoints, self.dist,
                             self.sampler.gen.get_state() if self.sampler is not None else None,
                             self.batches.state())

    def run(self, iterations: int | None = None, on_iteration=None) -> list[dict]:
        """Train until `train.iterations` (or the env-step budget, or `iterations` more); returns this
        call's metrics rows. `on_iteration(i)` may return a context manager wrapped around iteration i
        (the profiler uses it). SIGINT or SIGTERM finishes the iteration in progress, writes a
        checkpoint and returns (a second SIGINT aborts at once); `self.interrupted` says so."""
        import time

        cfg, main = self.cfg, self.dist.main
        end = cfg.train.iterations if iterations is None else min(cfg.train.iterations, self.iteration + iterations)
        bar = self._progress_bar()
        rows = []
        every = max(1, (end - self.iteration) // 20)  # about twenty progress lines per run in train.log
        t0 = time.perf_counter()
        self.interrupted = False
        self.trackers = Trackers(self.tracker_names, self.run_dir, cfg.to_dict(), self.resumed or self.iteration > 0)
        with stop_on_signals(self, self.cfg.train.stop_grace) as stops, closing(self.trackers), _logging_above(bar), \
                self._generation(end):
            while self.iteration < end and not self.interrupted:
                if self._finished(self.iteration, self.env_steps):
                    log.info("env-step budget %d reached at iteration %d", cfg.train.env_step_budget, self.iteration)
                    break
                with on_iteration(self.iteration) if on_iteration else nullcontext():
                    row = self.iteration_step()
                if main:
                    self.metrics.write(row)
                    self.trackers.write(row)
                rows.append(row)
                self.interrupted = self.dist.flag(self.interrupted)  # a stop on any rank stops all, together
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(reward=f"{row['reward']:.2f}", success=f"{row['success']:.2f}",
                                    env_steps=row["env_steps"])
                if main and (bar is None or row["iteration"] % every == 0 or "eval_success" in row):
                    log.info("%s", progress_line(row))
                if self.iteration % cfg.train.checkpoint_every == 0:
                    with stops.unwatched():  # train.stop_grace times the iteration, not its checkpoint
                        self.save_checkpoint()
        if bar is not None:
            bar.close()
        self._finish(rows, time.perf_counter() - t0)
        return rows

    @contextmanager
    def _generation(self, end: int):
        """rollout.asynchronous: the generation worker runs while the loop does; it starts from the
        weights and the iteration the run is at, and it is stopped whatever way the loop ends. If
        it dies, the checkpoint of where the run is (the iteration that found it had changed
        nothing yet) is written before the error goes up. A run with nothing left to do before
        iteration `end` (a finished run resumed) starts none."""
        if not self.cfg.rollout.asynchronous or self._finished(self.iteration, self.env_steps) or self.iteration >= end:
            yield
            return
        self.engine.sleep()  # this engine validates only now: its memory is the worker's between validations
        self.batches = AsyncBatches(self.cfg, self.model, self.iteration, self.device, self.run_dir / ".batches")
        log.info("generation worker started (pid %d): batches from iteration %d, at most %d versions old",
                 self.batches.proc.pid, self.iteration, self.cfg.rollout.max_lag)
        self._seen_times = (0.0, 0.0, 0.0)
        try:
            yield
        except GenerationWorkerDied:
            self.save_checkpoint()
            raise
        finally:
            lost = self.batches.close()
            log.info("generation worker stopped: %d episodes generated, %d of them in flight and discarded (a resume "
                     "generates those batches again)", self.batches.generated, lost)
            if self.batches.unseen_death:
                log.warning("%s, before the run stopped", self.batches.unseen_death)

    def _worker_times(self) -> dict:
        """rollout.asynchronous: this iteration's seconds the trainer waited for a batch, and the
        worker's seconds idle (waiting for weights or for room in its queue) and generating."""
        if not isinstance(self.batches, AsyncBatches):
            return {}
        b = self.batches
        now = (b.wait_s, b.worker_idle_s, b.worker_gen_s)
        d = [x - y for x, y in zip(now, self._seen_times)]
        self._seen_times = now
        return {"trainer_wait_s": round(d[0], 4), "worker_idle_s": round(d[1], 4), "worker_generate_s": round(d[2], 4)}

    def _progress_bar(self):
        """A tqdm bar over the run's iterations on rank 0 with train.progress on and stderr a
        terminal, else None: the loop then logs one progress line an iteration instead."""
        if not (self.cfg.train.progress and self.dist.main and on_terminal()):
            return None
        from tqdm import tqdm

        return tqdm(total=self.cfg.train.iterations, initial=self.iteration, desc=self.run_dir.name,
                    dynamic_ncols=True)

    def _finish(self, rows: list[dict], seconds: float) -> None:
        """After the loop: the last checkpoint, the plot, the exported policy of a finished run, and
        the closing lines (or how to resume an interrupted one)."""
        cfg, main = self.cfg, self.dist.main
        if rows and self.iteration % cfg.train.checkpoint_every:  # the end, if not just saved
            self.save_checkpoint()
        png = None
        if main:
            try:
                png = plot(self.run_dir)
            except ValueError as e:  # e.g. no row to draw yet
                log.warning("learning curve not drawn: %s", e)
        if rows and not self.interrupted and self._finished(self.iteration, self.env_steps):
            from .export import save_hf

            final = save_hf(self.model, self.tok, self.run_dir / "final", net=self.policy.net, dist=self.dist,
                            source=self.model_path)
            if main:
                log.info("trained policy as a Hugging Face folder: %s", final)
        if main and self.interrupted:
            log.info("interrupted at iteration %d; resume with: freshper train --resume %s", self.iteration,
                     self.run_dir)
        elif main and rows:
            log.info("%s", summary(rows, self.iteration, self.env_steps, seconds, self.run_dir, png,
                                   cfg.eval.episodes * cfg.eval.samples))


def _logging_above(bar):
    """Log lines printed above a tqdm bar, not into it; nothing without a bar."""
    if bar is None:
        return nullcontext()
    from tqdm.contrib.logging import logging_redirect_tqdm

    return logging_redirect_tqdm(loggers=[logging.getLogger()])
