"""The checkout's top-level folders answer only to their `freshper.*` names.

The repository keeps `kernels/`, `trainer/` and `profiling/` at its top level (the design's
layout), and setup.py installs them as `freshper.kernels`, `freshper.trainer` and
`freshper.profiling`. Any Python started from the checkout's root (`python -c`, `python -m
pytest`, `torchrun -m`, setuptools running setup.py) has that root on `sys.path`, so a bare
`import kernels` would find the folder before an installed distribution of the same name:
Hugging Face's `kernels`, which transformers 5.25 imports, is one. Each folder's `__init__.py`
calls `defer_to_installed` when it is being imported by its bare name; the installed
distribution then takes the name. With none installed the bare name stays an empty module,
not an error: libraries probe for optional packages by importing them (transformers 5.19 imports
`kernels` whenever `find_spec` finds one, and reads a module without a version as absent).
"""
import importlib.machinery
import importlib.util
import os
import sys

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def defer_to_installed(name: str) -> None:
    """Replace `sys.modules[name]` (a top-level folder of this checkout being imported by its
    bare name) by the installed module of that name, found on `sys.path` without the checkout's
    root. Where none is installed, nothing changes: the caller leaves its module empty."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != CHECKOUT]
    spec = importlib.machinery.PathFinder.find_spec(name, rest)
    if spec is None:
        return
    module = importlib.util.module_from_spec(spec)
    # The import statement returns whatever sys.modules holds once this body ends.
    sys.modules[name] = module
    spec.loader.exec_module(module)
