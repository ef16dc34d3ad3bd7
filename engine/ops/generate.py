"""Tensors made from numbers and shapes, not from data: Range (torch.arange) and Full (torch.full / zeros / ones
and their `_like` and `new_*` forms; Tensor.fill).

Both need their bounds and shapes before running (the output shape depends on them); shape arithmetic provides
them for dynamic graphs. A small result is computed at infer time and never scheduled.
"""

from __future__ import annotations

import math

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ir.dtypes import to_dtype
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import ints, with_value


# -- Range -------------------------------------------------------------------------------------------------------
def _scalar(node: Node, what: str, info: TensorInfo):
    if info.value is None:
        raise ShapeError(f"{node.where()}: Range {what} is not known before running")
    v = np.asarray(info.value)
    if v.size != 1 or v.dtype.kind not in "iuf":
        raise ShapeError(f"{node.where()}: Range {what} must be one number, got {v.dtype} {v.shape}")
    return v.reshape(()).item()


def range_values(node: Node, start, end, step) -> np.ndarray:
    """torch.arange: start + i * step for i < ceil((end - start) / step), computed in float64 for floats."""
    dtype = to_dtype(node.params["dtype"])
    if step == 0:
        raise ShapeError(f"{node.where()}: Range step is 0")
    n = max(0, math.ceil((end - start) / step))
    if dtype.kind == "f":
        return (start + np.arange(n, dtype=np.float64) * step).astype(dtype)
    return np.arange(n, dtype=np.int64).astype(dtype) * int(step) + dtype.type(start)


def _range_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 3:
        raise ShapeError(f"{node.where()}: Range takes (start, end, step), got {len(ins)} inputs")
    start, end, step = (_scalar(node, w, i) for w, i in zip(("start", "end", "step"), ins, strict=True))
    values = range_values(node, start, end, step)
    return [TensorInfo(values.shape, values.dtype, values)]


def _range_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [range_values(node, *(np.asarray(a).reshape(()).item() for a in arrays))]


# -- Full --------------------------------------------------------------------------------------------------------
def full_shape(node: Node, ins: list[TensorInfo]) -> tuple[int, ...]:
    if len(ins) > 1:
        raise ShapeError(f"{node.where()}: Full takes at most a shape input, got {len(ins)} inputs")
    if ins:
        if ins[0].value is None:
            raise ShapeError(f"{node.where()}: Full shape input is not known before running")
        shape = ints(node, "shape", ins[0].value)
    elif node.params.get("shape") is not None:
        shape = ints(node, "shape", node.params["shape"])
    else:
        raise ShapeError(f"{node.where()}: Full has neither a shape input nor a shape param")
    if any(d < 0 for d in shape):
        raise ShapeError(f"{node.where()}: Full shape {shape} has a negative dim")
    return tuple(shape)


def _full_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    out = TensorInfo(full_shape(node, ins), to_dtype(node.params["dtype"]))
    return with_value(node, ins, [out], full_reference)


def full_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    infos = [TensorInfo(tuple(np.shape(a)), np.asarray(a).dtype, np.asarray(a)) for a in arrays]
    return [np.full(full_shape(node, infos), node.params["value"], to_dtype(node.params["dtype"]))]


register(OpDef("Range", _range_infer, _range_reference, arity=(3, 3)),
         OpDef("Full", _full_infer, full_reference, arity=(0, 1)))
