"""FreshPER: freshness-aware prioritized experience replay for RL post-training of LLMs.

Ma et al., 2026, arXiv 2604.16918. The buffer samples trajectory i with probability
proportional to ((p_i + eps) * exp(-age_i / tau))^alpha; see freshper/priorities.py for why
this needs no per-step refresh.
"""
from freshper.buffer import EVICTIONS, SAMPLERS, ReplayBuffer, SampleBatch
from freshper.priorities import MODES, base_priority, log_keys
from freshper.schedule import LinearSchedule, linear_beta

__version__ = "0.1.0"
__all__ = ["ReplayBuffer", "SampleBatch", "LinearSchedule", "linear_beta", "base_priority", "log_keys",
           "MODES", "EVICTIONS", "SAMPLERS"]
