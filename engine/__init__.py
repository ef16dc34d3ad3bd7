"""nnserve engine: load TNN and PNNX models and run them on the CPU from one preallocated arena.

    model = engine.load("resnet18.pnnx.param")
    inst = model.instance(max_shapes={"in0": (1, 3, 224, 224)})
    outputs = inst.run({"in0": x})

The runtime names below load on first use, so importing a lower layer alone (`import engine.ops`: numpy only)
does not pull in the devices' libraries (numba, oneDNN).
"""

import importlib
from typing import TYPE_CHECKING

from engine.errors import (
    ArenaOverflowError,
    EngineError,
    InputValueError,
    KernelError,
    ModelFormatError,
    ShapeError,
    UnsupportedOpError,
)

if TYPE_CHECKING:  # the names the lazy loader below gives, for type checkers
    from engine.devices import cuda_device_count
    from engine.formats.registry import FORMATS, Format, format_of
    from engine.ir.dtypes import DTYPES
    from engine.ops.quant import holds_nan
    from engine.runtime.instance import Instance, RunTimings, release_thread
    from engine.runtime.model import Model, TensorSpec, load
    from engine.runtime.options import EngineOptions

_RUNTIME = {"Instance": "engine.runtime.instance", "RunTimings": "engine.runtime.instance",
            "release_thread": "engine.runtime.instance",
            "Model": "engine.runtime.model", "TensorSpec": "engine.runtime.model", "load": "engine.runtime.model",
            "FORMATS": "engine.formats.registry", "Format": "engine.formats.registry",
            "format_of": "engine.formats.registry", "DTYPES": "engine.ir.dtypes",
            "cuda_device_count": "engine.devices", "holds_nan": "engine.ops.quant",
            "EngineOptions": "engine.runtime.options"}


def __getattr__(name: str):
    module = _RUNTIME.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "DTYPES",
    "EngineOptions",
    "FORMATS",
    "ArenaOverflowError",
    "EngineError",
    "Format",
    "InputValueError",
    "Instance",
    "KernelError",
    "Model",
    "ModelFormatError",
    "RunTimings",
    "ShapeError",
    "TensorSpec",
    "UnsupportedOpError",
    "cuda_device_count",
    "format_of",
    "holds_nan",
    "load",
    "release_thread",
]
