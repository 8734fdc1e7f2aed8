"""The profiling recipes behind `freshper profile`: Nsight Systems on CUDA, torch.profiler on CPU.

On CUDA the run is re-launched under

    nsys profile -t cuda,nvtx --capture-range=cudaProfilerApi --capture-range-end=stop -o OUT ...

and the trainer brackets iterations S..E with cudaProfilerStart/Stop, so the report holds
exactly that window with the NVTX phase ranges (rollout, generate, env_step, ...). On CPU the
same window is recorded by torch.profiler and written as a Chrome trace (chrome://tracing or
https://ui.perfetto.dev), with the same phase names as record_function labels.
"""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import torch


def parse_window(text: str) -> tuple[int, int]:
    """'S:E' -> (S, E), iterations S..E inclusive, 0 <= S <= E."""
    try:
        s, e = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"--iterations must look like S:E (e.g. 2:4), got {text!r}") from None
    if not 0 <= s <= e:
        raise ValueError(f"--iterations S:E needs 0 <= S <= E, got {text!r}")
    return s, e


def nsys_command(out: Path, child: list[str]) -> list[str]:
    """The nsys command line that profiles `child` (argv) between cudaProfilerStart and Stop."""
    nsys = shutil.which("nsys")
    if nsys is None:
        raise FileNotFoundError("nsys (Nsight Systems) is not on PATH; install it from NVIDIA's CUDA toolkit "
                                "or run on CPU for a torch.profiler trace")
    return [nsys, "profile", "-t", "cuda,nvtx", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
            "--force-overwrite=true", "-o", str(out), *child]


class CudaWindow:
    """on_iteration hook: cudaProfilerStart before iteration S, Stop after iteration E."""

    def __init__(self, start: int, end: int):
        self.start, self.end = start, end

    @contextlib.contextmanager
    def __call__(self, iteration: int):
        if iteration == self.start:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
        try:
            yield
        finally:
            if iteration == self.end:
                torch.cuda.synchronize()
                torch.cuda.cudart().cudaProfilerStop()


class CpuWindow:
    """on_iteration hook: torch.profiler over iterations S..E, exported as a Chrome trace."""

    def __init__(self, start: int, end: int, trace: Path):
        self.start, self.end, self.trace = start, end, Path(trace)
        self.prof = None

    @contextlib.contextmanager
    def __call__(self, iteration: int):
        if iteration == self.start:
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=False)
            self.prof.__enter__()
        try:
            yield
        finally:
            if iteration == self.end and self.prof is not None:
                self.prof.__exit__(None, None, None)
                self.trace.parent.mkdir(parents=True, exist_ok=True)
                self.prof.export_chrome_trace(str(self.trace))
                self.prof = None
