"""A Config from a preset, a YAML file and overrides, in that order; and the resolved config as
YAML (a run's config.yaml)."""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import yaml

from ..presets import PRESET_NEEDS, PRESET_NEEDS_WHY, PRESETS
from .checks import env_options, foreign_env_options, validate
from .fields import YamlLoader, check_field, convert, field_table, field_table_of, flatten, resolve_key
from .options import Config, EnvConfig


def apply(cfg: Config, overrides: dict, strict: bool = False) -> Config:
    """Set `{'section.field' or unique 'field': value}` on `cfg` (validated, in place); `strict`:
    values keep their own types (YAML), none is parsed from text."""
    table = field_table()
    resolved = {resolve_key(k, table): v for k, v in overrides.items()}
    for key, value in resolved.items():
        typ = table[key][0]
        value = convert(key, typ, value, strict)
        check_field(key, value)
        sec, name = key.split(".", 1)
        setattr(getattr(cfg, sec), name, value)
    return cfg


def load(preset: str = "frozenlake", config_file: str | None = None, overrides: dict | None = None,
         run_config: bool = False) -> Config:
    """A validated Config from preset, then YAML file, then overrides. `run_config`: the file is a
    run's own config.yaml; one written before environments declared their options holds every
    env.* field, and those its environment does not take are dropped (and logged) instead of
    refused."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; presets: {', '.join(PRESETS)}")
    cfg = apply(Config(), PRESETS[preset])
    given: set[str] = set()  # env.* keys set after the preset, by the file or the command line
    if config_file:
        path = Path(config_file)
        if not path.is_file():
            raise ValueError(f"--config {config_file}: no such file")
        try:
            data = yaml.load(path.read_text(), Loader=YamlLoader) or {}
        except yaml.YAMLError as e:
            where = getattr(e, "problem_mark", None)
            at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
            raise ValueError(f"--config {config_file} is not valid YAML{at}: "
                             f"{getattr(e, 'problem', None) or type(e).__name__}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{config_file} must hold a mapping of sections to fields")
        sections = {f.name for f in fields(Config)}
        for k, v in data.items():
            if k in sections and not isinstance(v, dict):
                raise ValueError(f"{config_file}: {k} is a section and needs a mapping of its fields, e.g. "
                                 f"'{k}:\n  {next(iter(field_table_of(k)))}: ...', got {v!r}")
        apply(cfg, flatten(data), strict=True)
        given |= {resolve_key(k) for k in flatten(data)}
        if run_config and "staleness" not in (data.get("algo") or {}):
            # a run from before algo.staleness trained its lagged batches as if fresh: it goes on so
            cfg.algo.staleness = "none"
        if run_config and cfg.algo.staleness == "gate" and "stale_max_age" not in (data.get("algo") or {}):
            # a run from before algo.stale_max_age gated its batches by algo.max_age (which also limits
            # the replay buffer, as before): it goes on so
            cfg.algo.stale_max_age = cfg.algo.max_age
        if run_config:  # an old run's file: its other environments' fields are dropped below, not refused
            own = env_options(cfg.env.name)
            given = {k for k in given if not k.startswith("env.") or k[4:] in own}
            unused = foreign_env_options(cfg.env)
            for k in unused:
                setattr(cfg.env, k, getattr(EnvConfig(), k))
            if unused:
                import logging

                logging.getLogger("freshper").warning(
                    "%s: dropped %s, not options of env.name=%r (written by a version that saved every env field)",
                    config_file, ", ".join(f"env.{k}={v!r}" for k, v in unused.items()), cfg.env.name)
    apply(cfg, overrides or {})
    given |= {resolve_key(k) for k in overrides or {}}
    # Another environment than the preset's: the preset's options for its own are dropped, not refused.
    preset_env = PRESETS[preset].get("env.name", EnvConfig().name)
    if cfg.env.name != preset_env:
        for k in foreign_env_options(cfg.env):
            if f"env.{k}" in PRESETS[preset] and f"env.{k}" not in given:
                setattr(cfg.env, k, getattr(EnvConfig(), k))
    own = env_options(cfg.env.name)
    foreign = sorted(k for k in given if k.startswith("env.") and k[4:] not in own)
    if foreign:  # given for another environment, at whatever value: it would be silently unused
        raise ValueError(f"{foreign[0]}={getattr(cfg.env, foreign[0][4:])!r} is not an option of "
                         f"env.name={cfg.env.name!r}; its options: "
                         + ", ".join(f"env.{o}" for o in own[1:]))
    validate(cfg)
    missing = [k for k in PRESET_NEEDS.get(preset, ()) if getattr(getattr(cfg, k.split(".")[0]), k.split(".")[1]) == ""]
    if missing:
        raise ValueError(f"preset {preset} needs " + " and ".join(f"--{k}" for k in missing)
                         + f" ({PRESET_NEEDS_WHY[preset]})")
    return cfg


def to_yaml(cfg: Config) -> str:
    """The resolved config; of the env section only the options its environment takes."""
    d = cfg.to_dict()
    d["env"] = {k: d["env"][k] for k in env_options(cfg.env.name)}
    return yaml.safe_dump(d, sort_keys=False)
