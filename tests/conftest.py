"""Test-wide setup. Triton kernels run in its CPU interpreter, which must be chosen before
triton is first imported; tests that compare against the kernels call `*_triton` directly."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
