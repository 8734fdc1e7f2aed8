"""Writes docs/commits.md: each commit the pages quote, with its date and subject (from git).

    python docs/commits.py      # from the checkout's root, after quoting a new commit
"""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "RESULTS.md", "BENCHMARKS.md", "results/HISTORY.md", "results/PILOTS.md",
         "results/benchmarks/HISTORY.md",
         *(f"results/study-{s}/README.md" for s in ("multiply", "frozenlake", "precision-cpu", "staleness",
                                                              "stale-replay"))]
HASH7 = re.compile(r"(?<![0-9a-zA-Z_/.-])([0-9a-f]{7})(?![0-9a-zA-Z_-])")
HEAD = """# Commits the figures name

The figures in README.md, RESULTS.md, BENCHMARKS.md and their history pages name the commit
they were measured at. This table gives each one's date and what it changed, so a figure can be
placed in time; `git show HASH` gives the rest. The version is 0.1.0 throughout (no release yet);
`python docs/commits.py` rewrites this page.

| date | commit | what it changed |
|---|---|---|
"""


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def main() -> None:
    pages = [ROOT / p for p in PAGES] + sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "commits.md")
    quoted = {h for p in pages for h in HASH7.findall(p.read_text(encoding="utf-8"))}
    rows = []
    for h in sorted(quoted):
        if git("cat-file", "-t", h) != "commit":
            continue
        date, subject = git("log", "-1", "--format=%cs%x09%s", h).split("\t", 1)
        if len(subject) > 110:
            subject = subject[:107].rsplit(" ", 1)[0] + " ..."
        rows.append((date, h, subject.replace("|", "\\|")))
    body = "".join(f"| {d} | `{h}` | {s} |\n" for d, h, s in sorted(rows))
    (ROOT / "docs" / "commits.md").write_text(HEAD + body, encoding="utf-8")
    print(f"{len(rows)} commits in docs/commits.md")


if __name__ == "__main__":
    main()
