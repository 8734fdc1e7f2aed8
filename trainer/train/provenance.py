"""Which code a run ran, and on what: the git commit of the source tree the trainer was imported
from, and the machine.

A study compares runs that must all run the same code; each run folder records it in
source.json ({"commit", "dirty", "python", "torch", "machine"} at the start, and each resume's
commit and machine appended under "resumed"), so a reader can check that, instead of trusting
it. The machine matters to readouts in seconds: machines of one kind differ up to 3x in speed.
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


def machine() -> dict:
    """What the run's speed depends on: the CPU's model name, its widest SIMD (avx512, avx2 or
    neither, from /proc/cpuinfo's flags on Linux), the cores torch may use, and the GPU's name."""
    import os

    import torch

    name, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not name:
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:  # not Linux: the platform's own words
        pass
    name = name or platform.processor() or platform.machine()
    simd = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    return {"cpu": name, "simd": simd, "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(), "gpu": gpu}


def record(run_dir: Path, resumed: bool) -> dict:
    """Write (or, on resume, extend) run_dir/source.json; returns its content."""
    import torch

    sha, dirty = source_commit()
    path = Path(run_dir) / "source.json"
    if resumed and path.exists():
        info = json.loads(path.read_text())
        info.setdefault("resumed", []).append({"commit": sha, "dirty": dirty, "machine": machine()})
    else:
        info = {"commit": sha, "dirty": dirty, "python": platform.python_version(), "torch": torch.__version__,
                "machine": machine()}
    path.write_text(json.dumps(info, indent=1) + "\n")
    return info
