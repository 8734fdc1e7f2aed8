"""Triton kernels, each beside its torch reference. Nothing here knows about buffers or models."""
from .sampler import sample, sample_reference, sample_triton

__all__ = ["sample", "sample_reference", "sample_triton"]
