"""Import hygiene: `import freshper` stays light, and the layers import one way only."""
import subprocess
import sys


def loaded_after(stmt: str) -> set[str]:
    code = f"import sys; {stmt}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                         env={"PATH": "", "TRITON_INTERPRET": "0"})
    return set(out.stdout.split())


def test_import_freshper_loads_neither_numba_nor_triton_nor_the_trainer():
    mods = loaded_after("import freshper")
    assert not {"numba", "triton", "transformers", "freshper.buffer", "freshper.trainer"} & mods


def test_the_buffer_loads_numba_only_for_the_tree_and_triton_only_to_sample():
    mods = loaded_after("from freshper import ReplayBuffer; ReplayBuffer(4, sampler='scan')")
    assert "freshper.buffer" in mods and not {"numba", "triton"} & mods


def test_kernels_import_neither_the_buffer_nor_profiling():
    mods = loaded_after("import freshper.kernels")
    assert not {"freshper.buffer", "freshper.profiling", "freshper.profiling.nvtx", "numba"} & mods
