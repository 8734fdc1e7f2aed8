"""Run configuration: dataclasses with one line of help per field (options.py), presets, YAML,
overrides (load.py), checks (fields.py per field, checks.py across fields); the command-line
flags are generated from the same declarations in flags.py.

Every field can be set from the command line as `--section.field value`; a field name that is
unique across sections may drop the section (`--engine vllm` means `--rollout.engine vllm`).
Precedence: defaults < preset < --config file.yaml < command-line overrides.
"""
from ..presets import PRESET_NEEDS, PRESET_NEEDS_WHY, PRESETS
from .checks import check_env_options, env_kwargs, env_options, foreign_env_options, user_env_kwargs, validate
from .fields import (
                     check_field,
                     choices,
                     convert,
                     field_table,
                     field_table_of,
                     flatten,
                     invalid_examples,
                     resolve_key,
                     resumable,
                     rules,
)
from .lag_history import resolve_lag_probs
from .load import apply, load, to_yaml
from .options import (
                     ENV_NAMES,
                     INSERT_PRIORITIES,
                     MATH_SCORERS,
                     TINY_SFT_STEPS,
                     AlgoConfig,
                     Config,
                     EnvConfig,
                     EvalConfig,
                     ModelConfig,
                     RolloutConfig,
                     TrainConfig,
                     buffer_insert,
                     lazy,
                     opt,
                     parse_lag_probs,
                     sft_steps,
                     warm_start_seed,
)

__all__ = ["PRESET_NEEDS", "PRESET_NEEDS_WHY", "PRESETS", "check_env_options", "env_kwargs", "env_options",
           "foreign_env_options",
           "user_env_kwargs", "validate", "check_field", "choices", "convert", "field_table", "field_table_of",
           "flatten", "invalid_examples", "resolve_key", "resumable", "rules", "apply", "load", "to_yaml", "ENV_NAMES",
           "INSERT_PRIORITIES", "MATH_SCORERS", "TINY_SFT_STEPS", "AlgoConfig", "Config", "EnvConfig", "EvalConfig",
           "ModelConfig", "RolloutConfig", "TrainConfig", "buffer_insert", "lazy", "opt",
           "parse_lag_probs", "resolve_lag_probs", "sft_steps", "warm_start_seed"]
