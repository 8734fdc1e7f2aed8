"""Where a run's randomness comes from: the global streams seeded per run and per iteration, the
initial states of each iteration as a pure function of the seed (so a resumed run and every arm
of a comparison see the same environments), and the GPU libraries' deterministic kernels."""
from __future__ import annotations

import torch


def seed_everything(seed: int) -> None:
    """Seed every global stream the run draws from: torch (CPU and CUDA), numpy, random."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_deterministic() -> None:
    """Ask every GPU library for its deterministic kernels (set before they first run): torch's
    deterministic algorithms, a fixed cuBLAS workspace, flash-attn's deterministic backward and
    vLLM's batch-invariant kernels. CPU runs are deterministic without it."""
    import os

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    os.environ.setdefault("FLASH_ATTENTION_DETERMINISTIC", "1")
    os.environ.setdefault("VLLM_BATCH_INVARIANT", "1")
    torch.use_deterministic_algorithms(True, warn_only=True)  # warn, not fail, where no such kernel exists
    torch.backends.cudnn.benchmark = False


def group_seeds(seed: int, iteration: int, groups: int) -> list[int]:
    """Initial states of iteration `iteration`: a pure function of (seed, iteration), so a resumed
    run and each arm of a comparison see the same environments."""
    return [(seed * 1_000_003 + iteration * 1_009 + g * 7_919) % (2**31 - 1) for g in range(groups)]
