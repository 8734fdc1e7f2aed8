"""The config fields as command-line flags: an argparse parser generated from the declarations.

Each field of trainer/config/options.py becomes `--section.field VALUE` (and `--field VALUE` where the
field's name is unique across sections), in one argument group per section, its help the
declaration's, its default shown as the chosen preset sets it. argparse splits the command line
(`--k v` and `--k=v`, negative numbers, `--help`); the declarations convert and check each value,
so every error stays one line naming the field and what it accepts. What argparse lacks is added
here: a flag may be given once, and an unknown one is named with its nearest fields.
"""
from __future__ import annotations

import argparse
import re
import textwrap

from . import config as C

WIDTH = 100  # --help fits 100 columns


class Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help at WIDTH columns; the epilog (the preset list) is wrapped by us, so that no
    preset name is split at its hyphens."""

    def __init__(self, prog):
        super().__init__(prog, width=WIDTH, max_help_position=36)

    def _format_action_invocation(self, action):
        # "--algo.mode, --mode {a,b}" rather than argparse's metavar after every alias
        if not action.option_strings or action.nargs == 0:
            return super()._format_action_invocation(action)
        return ", ".join(action.option_strings) + " " + self._format_args(action, action.dest.upper())


class RaisingParser(argparse.ArgumentParser):
    """A parser whose errors are ValueErrors (one line), for commands that report them themselves."""

    def error(self, message):
        raise ValueError(message)


class Field(argparse.Action):
    """A config field's flag: the value converted and checked by its declaration (the error is the
    declaration's one line, without argparse's "argument --x/--y:" before it), given once
    (`--train.iterations 3 --iterations 4` is refused: argparse would keep the last silently)."""

    def __init__(self, *args, field_type=str, **kwargs):
        super().__init__(*args, **kwargs)
        self.field_type = field_type

    def __call__(self, parser, namespace, text, option_string=None):
        if hasattr(namespace, self.dest):
            raise argparse.ArgumentError(None, f"--{self.dest} is given twice; give it once")
        try:
            value = C.convert(self.dest, self.field_type, text)
            C.check_field(self.dest, value)
        except ValueError as e:
            raise argparse.ArgumentError(None, str(e)) from None
        setattr(namespace, self.dest, value)


def preset_values(preset: str) -> dict:
    """{'section.field': value} with which `--preset PRESET` runs (the default where it is silent)."""
    if preset not in C.PRESETS:
        return {}
    return C.flatten(C.apply(C.Config(), C.PRESETS[preset]).to_dict())


# argparse takes "-1e-3" for a flag (its own pattern knows "-1" and "-.5" only), so a negative
# value in exponent form needed "--k=-1e-3"; this pattern reads every float literal as a value,
# and a comma-separated list of them that starts with a negative one (rollout.lag_probs).
_FLOAT = r"(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?"
NEGATIVE_NUMBER = re.compile(rf"^-{_FLOAT}(,\s*[-+]?{_FLOAT})*$|^-(inf|infinity|nan)$", re.IGNORECASE)


def add_config_flags(p: argparse.ArgumentParser, preset: str = "") -> None:
    """One flag per config field on `p`, a group per section; a short alias `--field` for a field
    name unique across sections unless `p` already has that flag (`freshper profile --iterations`).
    Unset flags are absent from the parsed namespace (`config_overrides` reads what was given)."""
    p._negative_number_matcher = NEGATIVE_NUMBER
    table = C.field_table()
    names = [k.split(".", 1)[1] for k in table]
    shown = preset_values(preset)
    groups = {}
    for key, (typ, default, help_) in table.items():
        section, name = key.split(".", 1)
        if section not in groups:
            groups[section] = p.add_argument_group(f"{section} (config section; --{section}.FIELD VALUE)")
        flags = [f"--{key}"]
        if names.count(name) == 1 and f"--{name}" not in p._option_string_actions:
            flags.append(f"--{name}")
        allowed = C.choices().get(key)
        metavar = "{" + ",".join(map(str, allowed)) + "}" if allowed else typ.__name__.upper()
        groups[section].add_argument(*flags, dest=key, action=Field, field_type=typ, default=argparse.SUPPRESS,
                                     metavar=metavar,
                                     help=f"{help_} (default {shown.get(key, default)!r})".replace("%", "%%"))


def presets_epilog() -> str:
    wrap = textwrap.TextWrapper(width=WIDTH, break_on_hyphens=False, break_long_words=False)
    return "\n".join(wrap.wrap(f"presets: {', '.join(C.PRESETS)}"))


def config_overrides(ns: argparse.Namespace, rest: list[str]) -> dict:
    """{'section.field': value} of the config flags given, once a parser's `parse_known_args`
    returned `ns` and `rest`; anything left over is an error naming it (an unknown key with its nearest fields)."""
    for arg in rest:
        if arg.startswith("--"):
            C.resolve_key(arg[2:].split("=", 1)[0])  # raises: unknown, or ambiguous between sections
        raise ValueError(f"unexpected argument {arg!r}; config flags look like --section.field VALUE")
    table = C.field_table()
    return {k: v for k, v in vars(ns).items() if k in table}


def parse_overrides(argv: list[str]) -> dict:
    """The config flags in `argv` (nothing else allowed) as {'section.field': value}; ValueError
    on any error. For commands that take their own arguments first and pass the rest on."""
    p = RaisingParser(add_help=False, allow_abbrev=False)
    add_config_flags(p)
    ns, rest = p.parse_known_args(argv)
    return config_overrides(ns, rest)
