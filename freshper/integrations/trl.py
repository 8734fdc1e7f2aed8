"""FreshPER replay inside TRL's GRPOTrainer: one import and one class swap.

    from freshper.integrations.trl import FreshPERGRPOConfig, FreshPERGRPOTrainer
    args = FreshPERGRPOConfig(output_dir="out", replay_mode="freshper", replay_tau=500, ...)  # + any GRPOConfig field
    trainer = FreshPERGRPOTrainer(model=..., reward_funcs=..., args=args, train_dataset=...)

What it adds to GRPO (TRL 1.x):
- Every generated completion is stored (prompt, completion, masks, the behaviour log-probs of
  the policy that generated it, its advantage and reward) in a FreshPER buffer on the training
  device, at the current optimizer step; priority |advantage| or |reward|.
- After each optimizer step, `replay_updates` replay steps: a batch sampled from the buffer
  (FreshPER, PER or uniform) goes through TRL's own loss (`GRPOTrainer.compute_loss`) with the
  stored behaviour log-probs as the old policy, so a replay step follows every setting TRL's
  step follows: each `loss_type` (grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo) with its
  aggregation, `delta`, `importance_sampling_level` (GSPO's sequence ratio), the entropy filter
  (`top_entropy_quantile`), `off_policy_mask_threshold`, the entropy bonus, the KL term
  (`beta`, `use_bias_correction_kl`) and the vLLM importance-sampling correction (its ratios are
  stored with each completion). The IS weight of a completion (`replay_is_weights`) multiplies
  its advantage: every loss type's policy term is linear in the advantage and depends on it
  otherwise only through its sign, so this is the weight times that completion's policy loss,
  with the sequence ratio of GSPO or the gamma weight of VESPO computed as TRL computes them;
  the KL term and the entropy bonus are not weighted. Each replay step accumulates
  `gradient_accumulation_steps` micro-batches, clips gradients and steps the optimizer (the
  learning-rate schedule and the adaptive entropy controller advance with TRL's own steps only);
  TRL's per-step metrics of a replay step are logged with a `replay/` prefix.
- `args=None` gives the replay defaults, as TRL gives GRPOConfig's; a plain GRPOConfig is refused
  before any model loads (replay options would be guessed otherwise).
- Optionally, as TRL's experimental replay-buffer GRPO trainer did, groups of a fresh batch whose
  rewards do not vary (zero advantage, no gradient) are replaced by completions sampled from the
  buffer (`replay_fill_zero_variance`), with their stored advantages and log-probs.
- Diagnostics in TRL's logs: replay/loss, replay/clip_frac, replay/age_mean, replay/age_max,
  replay/is_ess, replay/buffer_size. The buffer is saved in each checkpoint and restored on resume.
- Several processes (`accelerate launch`, torchrun): each rank keeps the completions it generated
  in its own buffer (`replay_capacity` per process) and a replay batch of `replay_batch_size`
  per process is drawn from the one global FreshPER distribution over all ranks' buffers
  (freshper.distributed.DistributedSampler), so a rank may hold more or fewer rows than its
  share. Each rank's loss is weighted by its share of the batch's rows or tokens (as loss_type
  counts them) times the number of processes, so the gradient that DDP / FSDP average equals the
  one-process gradient on the whole batch; a rank that drew no row runs a zero-weighted row, as
  every rank must join each backward. Checkpoints hold every rank's buffer; a resume on another
  number of processes redeals them (freshper.distributed.reshard). `replay_fill_zero_variance`
  draws from the rank's own buffer.
- Vision-language models (a processor as `processing_class`, images in the dataset's `image` or
  `images` column): each completion's images are stored as PNG bytes (freshper.images,
  `replay_image_bytes` per completion) and a replay step rebuilds `pixel_values`,
  `image_grid_thw` and `mm_token_type_ids` from them with the processor's image processor, so
  a replayed completion is scored on exactly the pixels it was generated from. One process only,
  and without `replay_fill_zero_variance` (both refused with a message).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from freshper import ReplayBuffer

# TRL loss types that divide their token sum by num_items_in_batch, the tokens of the whole batch
# over every process (the others divide by their own rows or tokens)
TOKEN_SUMMED = ("dapo", "cispo", "vespo")
_BUFFER_FILE = "freshper_buffer.safetensors"  # one process; rank r of several: freshper_buffer_rank{r}.safetensors


# The per-token inputs of TRL's loss that a stored row carries: {TRL's key: (buffer field, pad)}.
PER_TOKEN_STORED = {"sampling_per_token_logps": ("sampling_logp", 0.0),
                    "importance_sampling_ratio": ("is_ratio", 1.0), "tool_mask": ("tool_mask", 1)}


def _pad_to(t: torch.Tensor, width: int, left: bool, value) -> torch.Tensor:
    """(n, w) -> (n, max(w, width)), filled with `value` on the left (prompts) or right."""
    extra = width - t.size(1)
    if extra <= 0:
        return t
    fill = torch.full((t.size(0), extra), value, dtype=t.dtype, device=t.device)
    return torch.cat([fill, t] if left else [t, fill], 1)


def _opt(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass
class FreshPERGRPOConfig(GRPOConfig):
    """GRPOConfig plus the replay options (all prefixed `replay_`)."""

    replay_mode: str = _opt("freshper", "freshper | per | uniform (replay without priorities)")
    replay_updates: int = _opt(1, "K: replay steps after each optimizer step (0: none)")
    replay_batch_size: int = _opt(0, "completions per replay step (0: per_device_train_batch_size)")
    replay_capacity: int = _opt(10_000, "completions the buffer holds (FIFO eviction)")
    replay_alpha: float = _opt(0.6, "priority exponent")
    replay_beta: float = _opt(0.4, "IS-weight exponent")
    replay_tau: float = _opt(500.0, "freshness decay time, in optimizer steps")
    replay_eps: float = _opt(1e-6, "added to every base priority")
    replay_priority: str = _opt("advantage", "advantage (|advantage|) | reward (|reward|)")
    replay_is_weights: bool = _opt(True, "weight replayed completions by their IS weights")
    replay_fill_zero_variance: bool = _opt(False, "replace fresh groups whose rewards do not vary by replayed "
                                                  "completions (TRL's experimental replay trainer)")
    replay_max_prompt_length: int = _opt(512, "prompt tokens stored per completion (a longer prompt is an error "
                                               "while replay is on; nothing is stored with replay off)")
    replay_seed: int = _opt(0, "seed of the buffer's sampling")
    replay_image_bytes: int = _opt(65536, "vision-language models: bytes per completion for its images as PNG "
                                          "(a completion needing more is an error)")

    def __post_init__(self):
        super().__post_init__()
        checks = {
            "replay_mode": (self.replay_mode in ("freshper", "per", "uniform"), "one of freshper, per, uniform"),
            "replay_priority": (self.replay_priority in ("advantage", "reward"), "one of advantage, reward"),
            "replay_updates": (self.replay_updates >= 0, ">= 0"),
            "replay_batch_size": (self.replay_batch_size >= 0, ">= 0"),
            "replay_capacity": (self.replay_capacity > 0, "> 0"),
            "replay_max_prompt_length": (self.replay_max_prompt_length > 0, "> 0"),
            "replay_image_bytes": (self.replay_image_bytes >= 64, ">= 64"),
        }
        for name, (ok, allowed) in checks.items():
            if not ok:
                raise ValueError(f"{name} must be {allowed}, got {getattr(self, name)!r}")
        if self.replay_updates > 0:
            # replay steps call the optimizer themselves; DeepSpeed and FSDP wrap it in engines they own
            wrappers = [k for k in ("deepspeed", "fsdp") if getattr(self, k, None)]
            if wrappers:
                raise ValueError(f"replay steps (replay_updates > 0) drive the optimizer directly and cannot run under "
                                 f"{' or '.join(wrappers)}; use DDP (accelerate launch / torchrun) or set "
                                 f"replay_updates=0")

    @property
    def replay_on(self) -> bool:
        """Whether completions are stored at all."""
        return self.replay_updates > 0 or self.replay_fill_zero_variance


class _ReplayAfterStep(TrainerCallback):
    def __init__(self, trainer: "FreshPERGRPOTrainer"):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.replay_steps()


class FreshPERGRPOTrainer(GRPOTrainer):
    """GRPOTrainer with a FreshPER replay buffer; takes a `FreshPERGRPOConfig` as `args`."""

    def __init__(self, *args, **kwargs):
        import inspect

        bound = inspect.signature(GRPOTrainer.__init__).bind(self, *args, **kwargs)
        a = bound.arguments.get("args")
        if a is None:  # as TRL does with GRPOConfig: the defaults, named after the model
            model = bound.arguments["model"]
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "") or "model"
            a = FreshPERGRPOConfig(f"{name.rstrip('/').split('/')[-1]}-GRPO")
        elif not isinstance(a, FreshPERGRPOConfig):
            raise TypeError(f"args must be a FreshPERGRPOConfig (GRPOConfig plus the replay_* options), got "
                            f"{type(a).__name__}; build FreshPERGRPOConfig(**the same fields)")
        bound.arguments["args"] = a
        super().__init__(*bound.args[1:], **bound.kwargs)
        a = self.args
        self.replay_buffer = ReplayBuffer(a.replay_capacity, mode=a.replay_mode, alpha=a.replay_alpha,
                                          beta=a.replay_beta, tau=a.replay_tau, eps=a.replay_eps,
                                          device=self.accelerator.device, seed=a.replay_seed)
        self._rewards = None
        self._sampler = None  # the global draw over every rank's buffer, made at the first replay step
        if self._is_vlm and a.replay_on:
            if a.replay_fill_zero_variance:
                raise ValueError("replay_fill_zero_variance with a vision-language model is not supported (the "
                                 "filled rows' images would have to replace the batch's pixel values); set it False")
            if self.accelerator.num_processes > 1:
                raise ValueError("replay with a vision-language model runs on one process so far; got "
                                 f"{self.accelerator.num_processes}")
        self.add_callback(_ReplayAfterStep(self))

    # ------------------------------------------------------------------------- storing
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rewards = (per_func * self.reward_weights.to(per_func.device)[None]).nansum(1)
        return per_func

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if not self.model.training or not self.args.replay_on:
            return out
        ids, mask = out["completion_ids"], out["completion_mask"]
        behaviour = out.get("old_per_token_logps")
        if behaviour is None:  # TRL skips it when on-policy; replay needs the generating policy's log-probs
            vision = {k: out[k] for k in ("pixel_values", "image_grid_thw", "num_images", "mm_token_type_ids")
                      if k in out}
            with torch.no_grad():
                behaviour = self._get_per_token_logps_and_entropies(
                    self.model, torch.cat([out["prompt_ids"], ids], 1), torch.cat([out["prompt_mask"], mask], 1),
                    ids.size(1), self.args.per_device_train_batch_size, **vision)[0]
        n = ids.size(0)
        start = self.accelerator.process_index * n
        rewards = self._rewards[start:start + n].float()
        self._store(out, behaviour, rewards, self._pngs(inputs) if self._is_vlm else None)
        if self.args.replay_fill_zero_variance:
            out = self._fill_zero_variance(out, behaviour)
        return out

    @staticmethod
    def _pngs(inputs) -> list[list[bytes]]:
        """Each example's images (TRL's `images` or `image` column) as PNG bytes, in prompt order."""
        from freshper.images import to_png

        rows = []
        for ex in inputs:
            imgs = ex.get("images") if "images" in ex else ([ex["image"]] if ex.get("image") is not None else [])
            rows.append([to_png(im) for im in (imgs or [])])
        return rows

    def _store(self, out, behaviour, rewards, pngs=None) -> None:
        a = self.args
        P, C = a.replay_max_prompt_length, a.max_completion_length
        # Only the columns that hold tokens: TRL pads to pad_to_multiple_of, which may exceed
        # max_completion_length, and left-pads prompts to the batch's longest.
        pm, cm = out["prompt_mask"], out["completion_mask"]
        p = int(pm.bool().any(0).sum())
        c = int(cm.sum(1).max()) if cm.numel() else 0
        if p > P:
            raise ValueError(f"a prompt of {p} tokens does not fit the replay buffer: raise replay_max_prompt_length "
                             f"(now {P}) or set replay_updates=0 and replay_fill_zero_variance=False")
        if c > C:
            raise ValueError(f"completions are {c} tokens long, more than max_completion_length={C}")
        width = pm.size(1)
        out = {**out, "prompt_ids": out["prompt_ids"][:, width - p:], "prompt_mask": pm[:, width - p:],
               "completion_ids": out["completion_ids"][:, :c], "completion_mask": cm[:, :c]}
        behaviour = behaviour[:, :c]
        pad = self._pad_id()
        adv = out["advantages"].float()
        base = adv.abs() if a.replay_priority == "advantage" else rewards.abs()
        extra = {}
        if out.get("sampling_per_token_logps") is not None:  # vLLM's log-probs (the off-policy mask's)
            extra["sampling_logp"] = _pad_to(out["sampling_per_token_logps"][:, :c].float(), C, False, 0.0)
        if out.get("importance_sampling_ratio") is not None:  # vLLM correction: (B, T) per token or (B, 1)
            r = out["importance_sampling_ratio"].float()
            extra["is_ratio"] = _pad_to(r[:, :c], C, False, 1.0) if r.size(1) > 1 else r
        if out.get("tool_mask") is not None:  # tool-calling completions: 0 on the tool's output tokens
            extra["tool_mask"] = _pad_to(out["tool_mask"][:, :c].to(torch.int8), C, False, 1)
        self.replay_buffer.add(
            base.double(), step=self.state.global_step, **extra,
            prompt_ids=_pad_to(out["prompt_ids"], P, True, pad), prompt_mask=_pad_to(out["prompt_mask"], P, True, 0),
            completion_ids=_pad_to(out["completion_ids"], C, False, pad),
            completion_mask=_pad_to(out["completion_mask"], C, False, 0),
            logp=_pad_to(behaviour.float(), C, False, 0.0), adv=adv, reward=rewards, **self._image_field(pngs))

    def _image_field(self, pngs) -> dict:
        if pngs is None:
            return {}
        from freshper.images import pack_pngs

        return {"images": pack_pngs(pngs, self.args.replay_image_bytes, "replay_image_bytes").to(
            self.replay_buffer.device)}

    def _replay_vision(self, ids, b) -> dict:
        """A replayed batch's VLM inputs rebuilt from its stored PNGs (empty for a text model)."""
        if "images" not in b.fields:
            return {}
        from freshper.images import from_png, unpack_pngs

        rows = unpack_pngs(b.images)
        flat = [from_png(p) for row in rows for p in row]
        out = {"num_images": [len(r) for r in rows],
               "mm_token_type_ids": (ids == self._image_pad_token_id).long()}
        if flat:
            px = self.processing_class.image_processor(images=flat, return_tensors="pt")
            out.update(pixel_values=px["pixel_values"].to(ids.device),
                       image_grid_thw=px["image_grid_thw"].to(ids.device))
        return out

    def replay_logps(self, model, ids, att, c1, b) -> torch.Tensor:
        """(B, c1) log-probs of a replayed batch's completion tokens under `model` (with its images)."""
        return self._get_per_token_logps_and_entropies(model, ids, att, c1, ids.size(0),
                                                       **self._replay_vision(ids, b))[0]

    def ref_logps(self, ids, att, c1, b) -> torch.Tensor:
        """(B, c1) reference log-probs of a replayed batch for the KL term: under TRL's reference
        model, or, where TRL made none because the model is a PEFT model, under the policy with
        its adapters disabled (the base weights), as TRL computes its own."""
        with torch.no_grad():
            if self.ref_model is not None:
                return self.replay_logps(self.ref_model, ids, att, c1, b)
            model = self.accelerator.unwrap_model(self.model)
            if not hasattr(model, "disable_adapter"):
                raise ValueError("beta > 0 needs a reference model for the replay steps' KL term, and TRL made "
                                 "none for this non-PEFT model; set beta=0 or replay_updates=0")
            with model.disable_adapter():
                return self.replay_logps(self.model, ids, att, c1, b)

    def _pad_id(self) -> int:
        tok = getattr(self.processing_class, "tokenizer", self.processing_class)  # a processor wraps one
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    # --------------------------------------------------------------------------- replay
    def _replay_batch(self, n: int, batch=None):
        """A sampled batch trimmed to its own widths: (ids, attention mask, completion width, batch)."""
        b = batch if batch is not None else self.replay_buffer.sample(n, step=self.state.global_step)
        p_keep = b.prompt_mask.bool().any(0).nonzero()
        p0 = int(p_keep.min()) if p_keep.numel() else b.prompt_ids.size(1) - 1
        c1 = max(1, int(b.completion_mask.sum(1).max()))
        ids = torch.cat([b.prompt_ids[:, p0:], b.completion_ids[:, :c1]], 1)
        att = torch.cat([b.prompt_mask[:, p0:], b.completion_mask[:, :c1]], 1)
        return ids, att, c1, b

    def replay_inputs(self, ids, att, c1, b, num_items: torch.Tensor) -> dict:
        """A replayed batch as the inputs TRL's compute_loss takes: its tokens and masks, the
        stored behaviour log-probs as `old_per_token_logps`, the stored advantages (times the IS
        weights with `replay_is_weights`), the reference log-probs when beta > 0, vLLM's stored
        log-probs and ratios, the images of a VLM; `num_items` is the token count the
        token-summed losses (dapo, cispo, vespo) divide by."""
        p = ids.size(1) - c1
        adv = b.adv.float()
        if self.args.replay_is_weights:
            adv = adv * b.weights.float()
        inputs = {"prompt_ids": ids[:, :p], "prompt_mask": att[:, :p], "completion_ids": ids[:, p:],
                  "completion_mask": att[:, p:], "advantages": adv, "old_per_token_logps": b.logp[:, :c1],
                  "num_items_in_batch": num_items, **self._replay_vision(ids, b)}
        if "sampling_logp" in b.fields:
            inputs["sampling_per_token_logps"] = b.sampling_logp[:, :c1]
        if "is_ratio" in b.fields:
            inputs["importance_sampling_ratio"] = b.is_ratio[:, :c1] if b.is_ratio.size(1) > 1 else b.is_ratio
        if "tool_mask" in b.fields:  # TRL's loss masks the tool's tokens with completion_mask * tool_mask
            inputs["tool_mask"] = b.tool_mask[:, :c1].to(att.dtype)
        if self.beta != 0.0:
            inputs["ref_per_token_logps"] = self.ref_logps(ids, att, c1, b)
        return inputs

    def replay_loss(self, inputs: dict, accumulate: int = 1) -> tuple[torch.Tensor, dict]:
        """TRL's loss of a replayed batch (differentiable) in a window of `accumulate`
        micro-batches, and the per-step metrics TRL logged for it."""
        from collections import defaultdict

        saved_metrics, self._metrics["train"] = self._metrics["train"], defaultdict(list)
        # the adaptive entropy controller follows TRL's steps: a replay step applies its coefficient
        controller = {k: getattr(self, k) for k in ("entropy_coef", "_last_world_entropy", "_entropy_window_stats")
                      if hasattr(self, k)}
        saved_accumulate = getattr(self, "current_gradient_accumulation_steps", None)
        self.current_gradient_accumulation_steps = accumulate
        try:
            # the wrapped model (DDP / FSDP under several processes): its backward reduces the gradients
            loss = self.compute_loss(self.model_wrapped, inputs)
        finally:
            metrics, self._metrics["train"] = self._metrics["train"], saved_metrics
            for k, v in controller.items():
                setattr(self, k, v)
            if saved_accumulate is not None:
                self.current_gradient_accumulation_steps = saved_accumulate
        return loss, metrics

    def _locally_normalised(self) -> bool:
        """Whether loss_type divides by this process's own rows or tokens (so several processes
        need their shares weighted), not by `num_items_in_batch` over all of them."""
        return self.args.loss_type not in TOKEN_SUMMED

    def replay_share(self, mask: torch.Tensor) -> torch.Tensor:
        """What `loss_type` divides a micro-batch's summed token losses by, for the rows of `mask`
        (B, T): tokens (bnpo), rows (grpo, sapo, luspo; dr_grpo times max_completion_length),
        tokens for the token-summed losses. A 0-d float tensor."""
        if self.args.loss_type == "bnpo" or self.args.loss_type in TOKEN_SUMMED:
            return mask.sum().float()
        return torch.tensor(float(mask.size(0)), device=mask.device)

    def _sharded_batch(self, n: int):
        """(ids, att, c1, batch, weight) of this rank's rows of a global draw of n x processes, and
        the weight that makes the ranks' averaged gradients the whole batch's (0 for a stand-in
        row where this rank drew none)."""
        from freshper.distributed import DistributedSampler

        world = self.accelerator.num_processes
        if self._sampler is None or self._sampler.buffer is not self.replay_buffer:
            self._sampler = DistributedSampler(self.replay_buffer, seed=self.args.replay_seed)
        b = self._sampler.sample(n * world, step=self.state.global_step)
        real = len(b) > 0
        if not real:  # every rank joins each backward: one row of its own, weighted 0
            b = self.replay_buffer.sample(1, step=self.state.global_step)
        ids, att, c1, b = self._replay_batch(n, batch=b)
        mine = self.replay_share(b.completion_mask[:, :c1].bool()) if real else torch.zeros((), device=ids.device)
        if not self._locally_normalised():  # num_items_in_batch already spans every process's tokens
            return ids, att, c1, b, torch.tensor(float(real), device=ids.device)
        total = self.accelerator.reduce(mine.clone(), reduction="sum")
        return ids, att, c1, b, mine * world / total.clamp_min(1.0)

    def replay_steps(self) -> None:
        """`replay_updates` optimizer steps on replayed batches; called after each optimizer step."""
        a = self.args
        if a.replay_updates == 0 or len(self.replay_buffer) == 0:
            return
        n = a.replay_batch_size or a.per_device_train_batch_size
        accumulate = max(1, a.gradient_accumulation_steps)
        world = self.accelerator.num_processes
        self.model.train()
        m = self._metrics["train"]
        for _ in range(a.replay_updates):
            # as the HF loop steps: gradient_accumulation_steps micro-batches of n rows (their losses
            # scaled by TRL as its own are), then one clip and one optimizer step
            window = [self._sharded_batch(n) if world > 1 else (*self._replay_batch(n), None)
                      for _ in range(accumulate)]
            tokens = sum(b.completion_mask[:, :c1].sum() * (w > 0 if w is not None else 1)
                         for _, _, c1, b, w in window).float()
            # TRL's token-summed losses divide by num_items / processes * accumulation / steps_per_generation
            num_items = self.accelerator.reduce(tokens, reduction="sum") * a.steps_per_generation / accumulate
            total = 0.0
            for ids, att, c1, b, weight in window:
                loss, metrics = self.replay_loss(self.replay_inputs(ids, att, c1, b, num_items), accumulate)
                if weight is not None:
                    loss = loss * weight
                self.accelerator.backward(loss)
                total += float(loss.detach())
                for k, v in metrics.items():
                    m[f"replay/{k}"].extend(v)
                age = b.age.double()
                m["replay/age_mean"].append(float(age.mean()))
                m["replay/age_max"].append(float(age.max()))
                m["replay/is_ess"].append(float(b.ess_fraction))
            m["replay/loss"].append(total)  # the window's loss, which this optimizer step descends
            if a.max_grad_norm:
                self.accelerator.clip_grad_norm_(self.model.parameters(), a.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad()
        m["replay/buffer_size"].append(len(self.replay_buffer))

    def _fill_zero_variance(self, out, behaviour):
        """Swap the rows of groups whose advantages are all zero for replayed completions."""
        G = self.num_generations
        adv = out["advantages"]
        flat = (adv.view(-1, G) == 0).all(1).repeat_interleave(G)
        k = int(flat.sum())
        if k == 0 or len(self.replay_buffer) == 0:
            return out
        _, _, _, b = self._replay_batch(k)
        rows = flat.nonzero().squeeze(1)
        P = max(out["prompt_ids"].size(1), int(b.prompt_mask.sum(1).max()))
        C = max(out["completion_ids"].size(1), int(b.completion_mask.sum(1).max()))

        pad_id = self._pad_id()
        new = {"prompt_ids": _pad_to(out["prompt_ids"], P, True, pad_id),
               "prompt_mask": _pad_to(out["prompt_mask"], P, True, 0),
               "completion_ids": _pad_to(out["completion_ids"], C, False, pad_id),
               "completion_mask": _pad_to(out["completion_mask"], C, False, 0),
               "old_per_token_logps": _pad_to(behaviour, C, False, 0.0)}
        new["prompt_ids"][rows] = b.prompt_ids[:, -P:].to(new["prompt_ids"].dtype)
        new["prompt_mask"][rows] = b.prompt_mask[:, -P:].to(new["prompt_mask"].dtype)
        new["completion_ids"][rows] = b.completion_ids[:, :C].to(new["completion_ids"].dtype)
        new["completion_mask"][rows] = b.completion_mask[:, :C].to(new["completion_mask"].dtype)
        new["old_per_token_logps"][rows] = b.logp[:, :C].to(new["old_per_token_logps"].dtype)
        # Every other per-token input of a filled row is the stored row's (vLLM's log-probs and IS
        # ratios, the tool mask) or, for the reference log-probs, recomputed: a row keeps nothing
        # of the completion it replaced.
        for key, (name, fill) in PER_TOKEN_STORED.items():
            t = out.get(key)
            if t is None:
                continue
            if name not in b.fields:
                raise ValueError(f"replay_fill_zero_variance: this batch has {key} but the stored rows do not "
                                 f"(stored before it was produced); they cannot fill its rows")
            stored = getattr(b, name)
            seq = key == "importance_sampling_ratio" and t.size(1) == 1  # one ratio per row
            t = (t if seq else _pad_to(t, C, False, fill)).clone()  # never written into TRL's own tensor
            t[rows] = stored[:, :1 if seq else C].to(t.dtype)
            new[key] = t
        if out.get("ref_per_token_logps") is not None:
            ref = _pad_to(out["ref_per_token_logps"], C, False, 0.0).clone()
            ids = torch.cat([new["prompt_ids"][rows], new["completion_ids"][rows]], 1)
            att = torch.cat([new["prompt_mask"][rows], new["completion_mask"][rows]], 1)
            ref[rows] = self.ref_logps(ids, att, C, b).to(ref.dtype)
            new["ref_per_token_logps"] = ref
        advantages = adv.clone()
        advantages[rows] = b.adv.to(adv.dtype)
        out = {**out, **new, "advantages": advantages,
               "num_items_in_batch": self.accelerator.gather(new["completion_mask"].sum()).sum()}
        self._metrics["train"]["replay/filled_rows"].append(k)
        return out

    # ------------------------------------------------------------------------ checkpoint
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        if self.accelerator.num_processes == 1:
            if self.args.should_save:
                self.replay_buffer.save(os.path.join(folder, _BUFFER_FILE))
            return
        os.makedirs(folder, exist_ok=True)  # each rank writes its own shard
        self.replay_buffer.save(os.path.join(folder, f"freshper_buffer_rank{self.accelerator.process_index}"
                                                     ".safetensors"))
        self.accelerator.wait_for_everyone()

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        import glob

        world, rank, dev = self.accelerator.num_processes, self.accelerator.process_index, self.accelerator.device
        shards = sorted(glob.glob(os.path.join(checkpoint, "freshper_buffer_rank*.safetensors")),
                        key=lambda f: int(f.rsplit("rank", 1)[1].split(".")[0]))
        files = shards or [f for f in [os.path.join(checkpoint, _BUFFER_FILE)] if os.path.exists(f)]
        if not files:
            if self.args.replay_updates > 0:
                import logging

                logging.getLogger("freshper").warning(
                    "checkpoint %s holds no replay buffer (%s): resuming with an empty buffer; replay starts again "
                    "from the completions generated from here on", checkpoint, _BUFFER_FILE)
            return
        if len(files) == world:
            self.replay_buffer = ReplayBuffer.load(files[rank], device=dev)
            return
        # saved by another number of processes: the shards redealt, replay_capacity each
        from freshper.checkpoint import read_safetensors
        from freshper.distributed import reshard

        states = [dict(zip(("tensors", "meta"), read_safetensors(f))) for f in files]
        mine = reshard(states, world, capacity=self.args.replay_capacity)[rank]
        self.replay_buffer = ReplayBuffer.from_state(mine, device=dev)
