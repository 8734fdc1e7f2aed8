"""Every Triton kernel compiled for CUDA sm_90 and sm_80 on this CPU machine, at the
configurations the code launches: it must compile, keep everything in registers (no local
memory, so no spills) and fit the shared memory of the target. The interpreter cannot see any of
this. It runs the compiler in a subprocess without TRITON_INTERPRET (the test session's triton
is the interpreter). FRESHPER_TRITON_SITES (folders holding other triton versions, separated by
":") repeats the check under each: CI runs it under triton 3.6, the GPU image's version, too."""
import json
import os
import subprocess
import sys

import pytest

from freshper.profiling.compile_cuda import SAMPLER_SIZES, SHARED_LIMIT

SITES = [""] + [s for s in os.environ.get("FRESHPER_TRITON_SITES", "").split(":") if s]


@pytest.fixture(scope="module", params=SITES, ids=lambda s: f"triton@{s}" if s else "triton")
def compiled(request):
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    if request.param:
        env["PYTHONPATH"] = request.param + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-m", "freshper.profiling.compile_cuda", "--json", "--arch", "90",
                          "--arch", "80"], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_every_kernel_compiles_for_sm90_and_sm80(compiled):
    errors = [(r["name"], r["arch"], r["error"]) for r in compiled if r["error"]]
    assert not errors, errors
    kernels = {r["name"].split()[0] for r in compiled}
    assert kernels == {"_block_stats", "_block_scan", "_search", "_policy_loss_fwd", "_rows", "_write"}
    assert {r["arch"] for r in compiled} == {80, 90}


def test_no_spills_and_shared_memory_fits(compiled):
    spills = [(r["name"], r["arch"], r["regs"], r["stack"]) for r in compiled if r["stack"]]
    assert not spills, f"local memory (spills) in {spills}"
    big = [(r["name"], r["arch"], r["shared"]) for r in compiled if r["shared"] > SHARED_LIMIT[r["arch"]]]
    assert not big, big
    assert max(r["regs"] for r in compiled) <= 255


def test_the_sampler_is_compiled_up_to_its_limit():
    from freshper.kernels.sampler import MAX_SLOTS, _plan

    assert max(n for n, _ in SAMPLER_SIZES) == MAX_SLOTS and 10**7 < MAX_SLOTS
    with pytest.raises(ValueError, match="at most 2147483647"):
        _plan(MAX_SLOTS + 1, 256, None)
