"""nnserve engine: load TNN and PNNX models and run them on the CPU from one preallocated arena.

    model = engine.load("resnet18.pnnx.param")
    inst = model.instance(max_shapes={"in0": (1, 3, 224, 224)})
    outputs = inst.run({"in0": x})
"""

from engine.devices import cuda_device_count
from engine.errors import (
    ArenaOverflowError,
    EngineError,
    KernelError,
    ModelFormatError,
    ShapeError,
    UnsupportedOpError,
)
from engine.formats.registry import FORMATS, Format
from engine.ir.dtypes import DTYPES
from engine.runtime.instance import Instance, RunTimings
from engine.runtime.model import Model, TensorSpec, load

__all__ = [
    "DTYPES",
    "FORMATS",
    "ArenaOverflowError",
    "EngineError",
    "Format",
    "Instance",
    "KernelError",
    "Model",
    "ModelFormatError",
    "RunTimings",
    "ShapeError",
    "TensorSpec",
    "UnsupportedOpError",
    "cuda_device_count",
    "load",
]
