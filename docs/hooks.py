"""mkdocs hooks: the site takes RESULTS.md and BENCHMARKS.md from the repository's top level (they
stay where a reader of the checkout looks for them), with the figures they show and the pages of
results/ they link (the history, the pilots, each pre-registered study's registration and runs),
and writes the configuration reference from the config dataclasses, so it cannot drift from the
code."""
from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
TOP = {"results.md": "RESULTS.md", "benchmark-tables.md": "BENCHMARKS.md", "history.md": "results/HISTORY.md",
       "pilots.md": "results/PILOTS.md",
       "multiply-secondaries.md": "results/compare-study-multiply/secondaries.md",
       "frozenlake-secondaries.md": "results/compare-study-frozenlake/secondaries.md",
       **{f"{name}-{page}.md": f"results/study-{folder}/{file}"  # each pre-registered study's folder
          for name, folder in (("stale-replay", "stale-replay"), ("staleness", "staleness"),
                               ("precision", "precision-cpu"), ("frozenlake", "frozenlake"), ("multiply", "multiply"))
          for page, file in (("registration", "REGISTRATION.md"), ("study", "README.md"))}}
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)]+\.png)\)")
LINK = re.compile(r"\]\(([^)#\s]+\.md)(#[^)]*)?\)")


def on_files(files, config):
    for uri, name in TOP.items():
        text = (ROOT / name).read_text(encoding="utf-8")
        files.append(File.generated(config, uri, content=text))
        for img in IMAGE.findall(text):
            files.append(File.generated(config, img, abs_src_path=str((ROOT / name).parent / img)))
    return files


def _site_links(markdown: str, page_path: Path) -> str:
    """Links written to resolve in the repository (docs/x.md -> ../RESULTS.md) pointed at the
    site's copies of those files (results.md): the pages read right on GitHub and on the site."""
    site = {(ROOT / name).resolve(): uri for uri, name in TOP.items()}

    def swap(m):
        target = site.get((page_path.parent / m.group(1)).resolve())
        return f"]({target}{m.group(2) or ''})" if target else m.group(0)
    return LINK.sub(swap, markdown)


def on_page_markdown(markdown, page, config, files):
    src = page.file.src_uri
    markdown = _site_links(markdown, ROOT / TOP[src] if src in TOP else ROOT / "docs" / src)
    if src == "configuration.md":
        return markdown.replace("<!-- options -->", options_reference())
    if src in ("trl.md", "api.md"):
        return markdown.replace("<!-- trl-options -->", trl_options())
    return markdown


def trl_options() -> str:
    """FreshPERGRPOConfig's replay options, from the dataclass: name, default, help."""
    import dataclasses

    from freshper.integrations.trl import FreshPERGRPOConfig

    rows = ["| option | default | what it does |", "|---|---|---|"]
    for f in dataclasses.fields(FreshPERGRPOConfig):
        if f.name.startswith("replay_"):
            rows.append(f"| `{f.name}` | `{f.default!r}` | {_cell(f.metadata.get('help', ''))} |")
    return "\n".join(rows) + "\n"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def options_reference() -> str:
    """One table per config section: key, type, the value `freshper train` runs with (the default
    preset's), allowed values, whether --resume may change it, help; env.* options also name the
    environments that take them."""
    from freshper.trainer import config as C
    from freshper.trainer.cli import DEFAULT_PRESET
    from freshper.trainer.envs import ENVS
    from freshper.trainer.flags import preset_values

    table, rules, choice = C.field_table(), C.rules(), C.choices()
    runs_with, resumable = preset_values(DEFAULT_PRESET), set(C.resumable())
    out, section = [], None
    for key, (typ, default, text) in table.items():
        sec = key.split(".", 1)[0]
        if sec != section:
            section = sec
            head = "| option | type | `freshper train` runs with | allowed | --resume | what it does |"
            out += ["", f"### {sec}", "", head, "|---|---|---|---|---|---|"]
        if key in choice:
            allowed = " \\| ".join(f"`{c}`" for c in choice[key])
        elif key in rules:
            allowed = rules[key][1]
        elif typ is bool:
            allowed = "true, false"
        else:
            allowed = "any"
        value = runs_with.get(key, default)
        shown = f"`{value!r}`" if not isinstance(value, str) else f"`\"{value}\"`"
        if value != default:
            shown += f" (the dataclass: `{default!r}`)"
        if sec == "env" and key != "env.name":
            takers = [name for name, cls in ENVS.items() if key[4:] in cls.OPTIONS]
            text = f"{text} [{', '.join(takers)}]"
        can = "may change" if key in resumable else "—"
        out.append(f"| `--{key}` | {typ.__name__} | {_cell(shown)} | {_cell(allowed)} | {can} | {_cell(text)} |")
    return "\n".join(out) + "\n"
