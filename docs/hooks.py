"""mkdocs hooks: the site takes RESULTS.md and BENCHMARKS.md from the repository's top level (they
stay where a reader of the checkout looks for them), with the figures they show, and writes the
configuration reference from the config dataclasses, so it cannot drift from the code."""
from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
TOP = {"results.md": "RESULTS.md", "benchmark-tables.md": "BENCHMARKS.md"}
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)]+\.png)\)")


def on_files(files, config):
    for uri, name in TOP.items():
        text = (ROOT / name).read_text(encoding="utf-8")
        files.append(File.generated(config, uri, content=text))
        for img in IMAGE.findall(text):
            files.append(File.generated(config, img, abs_src_path=str(ROOT / img)))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "configuration.md":
        return markdown.replace("<!-- options -->", options_reference())
    return markdown


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def options_reference() -> str:
    """One table per config section: key, type, default, allowed values, help."""
    from freshper.trainer import config as C

    table, rules, choice = C.field_table(), C.rules(), C.choices()
    out, section = [], None
    for key, (typ, default, text) in table.items():
        sec = key.split(".", 1)[0]
        if sec != section:
            section = sec
            out += ["", f"### {sec}", "", "| option | type | default | allowed | what it does |",
                    "|---|---|---|---|---|"]
        if key in choice:
            allowed = " \\| ".join(f"`{c}`" for c in choice[key])
        elif key in rules:
            allowed = rules[key][1]
        elif typ is bool:
            allowed = "true, false"
        else:
            allowed = "any"
        shown = f"`{default!r}`" if not isinstance(default, str) else f"`\"{default}\"`"
        out.append(f"| `--{key}` | {typ.__name__} | {_cell(shown)} | {_cell(allowed)} | {_cell(text)} |")
    return "\n".join(out) + "\n"
