"""FreshPER: freshness-aware prioritized experience replay for RL post-training of LLMs.

Ma et al., 2026, arXiv 2604.16918. The buffer samples trajectory i with probability
proportional to ((p_i + eps) * exp(-age_i / tau))^alpha; see freshper/priorities.py for why
this needs no per-step refresh.

The buffer's names resolve on first use, so `import freshper.kernels` (or `.profiling`) does not
load the buffer, and the buffer loads numba (CPU tree) or triton (CUDA kernels) only when a
sampler needs them.
"""
from freshper.batch_weight import weigh_momentum
from freshper.priorities import BASE_PRIORITIES, MODES, base_priority, log_keys
from freshper.schedule import LinearSchedule, linear_beta

_BUFFER_NAMES = ("EVICTIONS", "SAMPLERS", "ReplayBuffer", "SampleBatch")


def __getattr__(name):
    if name in _BUFFER_NAMES:
        from freshper import buffer

        return getattr(buffer, name)
    raise AttributeError(f"module 'freshper' has no attribute {name!r}")

__version__ = "0.1.0"
__all__ = ["ReplayBuffer", "SampleBatch", "LinearSchedule", "linear_beta", "base_priority", "log_keys",
           "weigh_momentum", "MODES", "BASE_PRIORITIES", "EVICTIONS", "SAMPLERS"]
