"""The declarations as tables ('section.field' -> type, default, help, choices, rules), and one
value checked and converted for its field; YAML read as people write numbers."""
from __future__ import annotations

import functools
import re
import typing
from dataclasses import fields

import yaml

from .options import Config, lazy


def field_table() -> dict[str, tuple[type, object, str]]:
    """{'section.field': (type, default, help)} for every field, help from the fields' metadata."""
    out = {}
    for sec in fields(Config):
        cls = sec.default_factory
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            out[f"{sec.name}.{f.name}"] = (hints[f.name], f.default, f.metadata["help"])
    return out


def _declared(what: str) -> dict:
    return {f"{sec.name}.{f.name}": f.metadata[what] for sec in fields(Config) for f in fields(sec.default_factory)
            if f.metadata[what] is not None}


@functools.cache
def choices() -> dict[str, tuple]:
    """{'section.field': allowed values} of every choice field, from the declarations."""
    return {k: v.resolve() if isinstance(v, lazy) else v for k, v in _declared("choices").items()}


@functools.cache
def rules() -> dict[str, tuple[typing.Callable, str]]:
    """{'section.field': (predicate, what passes)} of every field declared with a rule."""
    allowed = _declared("allowed")
    return {k: (pred, allowed[k]) for k, pred in _declared("rule").items()}


@functools.cache
def resumable() -> tuple[str, ...]:
    """The 'section.field' keys `--resume` may change, as declared (opt(resume=True))."""
    return tuple(k for k, v in _declared("resume").items() if v)


@functools.cache
def readers() -> dict[str, typing.Callable]:
    """{'section.field': its `read` function} of every field declared with one."""
    return _declared("read")


def invalid_examples() -> dict[str, str]:
    """{'section.field': a value it must refuse}, as declared."""
    return _declared("bad")


def field_table_of(section: str) -> list[str]:
    """The field names of one config section."""
    return [k.split(".", 1)[1] for k in field_table() if k.startswith(section + ".")]


def resolve_key(key: str, table: dict | None = None) -> str:
    """'algo.mode' stays; 'mode' becomes 'algo.mode' if unique; else ValueError listing keys."""
    table = table or field_table()
    if key in table:
        return key
    matches = [k for k in table if k.split(".", 1)[1] == key]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ValueError(f"config key {key!r} is ambiguous: one of {', '.join(matches)}")
    import difflib

    names = {k.split(".", 1)[1]: k for k in table}
    near = difflib.get_close_matches(key, list(table), n=2, cutoff=0.85)
    near += [names[n] for n in difflib.get_close_matches(key, list(names), n=2, cutoff=0.75) if names[n] not in near]
    hint = f"did you mean {' or '.join(near[:2])}?" if near else "freshper train --help lists every key"
    raise ValueError(f"unknown config key {key!r}; {hint}")


TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def convert(key: str, typ, value, strict: bool = False):
    """`value` as the field's type, then as its `read` function keeps it. Command-line values are
    text and are parsed; YAML values (`strict`) already have a type, which must be the field's:
    `iterations: "3"` is an error."""
    value = _typed(key, typ, value, strict)
    read = readers().get(key)
    return value if read is None else read(value)


def _typed(key: str, typ, value, strict: bool):
    if isinstance(value, str) and not (strict and typ is not str):
        if typ is bool:
            low = value.lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"{key} must be true or false, got {value!r}")
            return low in ("true", "1", "yes")
        try:
            return typ(value)
        except ValueError:
            raise ValueError(f"{key} must be {TYPE_WORDS[typ]}, got {value!r}") from None
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ValueError(f"{key} must be {TYPE_WORDS[typ]}, got {value!r}")
    return value


def check_field(key: str, value) -> None:
    """Raise ValueError naming `key` and its allowed values if `value` breaks its rule."""
    allowed = choices().get(key)
    if allowed is not None and value not in allowed:
        raise ValueError(f"{key} must be one of {allowed}, got {value!r}")
    rule = rules().get(key)
    if rule is not None:
        ok, allowed = rule
        if not ok(value):
            raise ValueError(f"{key} must be {allowed}, got {value!r}")


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class YamlLoader(yaml.SafeLoader):
    """YAML as people write numbers: PyYAML follows YAML 1.1, where `1e-6` (no dot) is a string;
    here, as in YAML 1.2 and every other parser, it is a float."""


YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$""",
               re.X),
    list("-+0123456789."))
