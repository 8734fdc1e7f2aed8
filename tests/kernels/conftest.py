"""Compiled semantics in the interpreter: a Python float kernel argument reaches compiled code as
an fp32 parameter, but the interpreter keeps it a float64 Python float. Every interpreted launch
in these tests gets its float arguments rounded to fp32 first, as the GPU would, so a scalar that
enters float64 arithmetic shows its rounding here too (the sampler's beta did: log-weight errors
up to 4.5e-7 against a 1e-9 tolerance)."""
import os

import numpy as np
import pytest

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def fp32_scalars(interpreter):
    """A replacement for the interpreter's argument conversion that makes float arguments fp32
    scalars (a float32 tl.tensor), leaving every other argument as the interpreter had it."""
    import triton.language as tl

    convert = interpreter._implicit_cvt

    def cvt(arg):
        if isinstance(arg, float):
            return tl.tensor(interpreter.TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
        return convert(arg)

    return cvt


@pytest.fixture(autouse=True)
def compiled_scalar_semantics(monkeypatch):
    if INTERPRETED:
        from triton.runtime import interpreter

        monkeypatch.setattr(interpreter, "_implicit_cvt", fp32_scalars(interpreter))
    yield
