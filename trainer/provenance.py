"""Which code a run ran: the git commit of the source tree the trainer was imported from.

A study compares runs that must all run the same code; each run folder records it in
source.json ({"commit", "dirty", "python", "torch"} at the start, and each resume's commit
appended under "resumed"), so a reader can check that, instead of trusting it.
"""
from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path


def source_commit() -> tuple[str, bool]:
    """(commit, dirty) of the git work tree holding this file, or ("unknown", False) outside one
    (an installed wheel). Dirty: tracked files differ from the commit."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown", False
    return sha, bool(status.strip())


def record(run_dir: Path, resumed: bool) -> dict:
    """Write (or, on resume, extend) run_dir/source.json; returns its content."""
    import torch

    sha, dirty = source_commit()
    path = Path(run_dir) / "source.json"
    if resumed and path.exists():
        info = json.loads(path.read_text())
        info.setdefault("resumed", []).append({"commit": sha, "dirty": dirty})
    else:
        info = {"commit": sha, "dirty": dirty, "python": platform.python_version(), "torch": torch.__version__}
    path.write_text(json.dumps(info, indent=1) + "\n")
    return info
