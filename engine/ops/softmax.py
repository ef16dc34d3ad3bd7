"""Softmax and LogSoftmax over one axis: a stable numpy reference."""

from __future__ import annotations

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import float_of, norm_axis


def axis_of(node: Node, rank: int) -> int:
    return norm_axis(node, int(node.params.get("axis", -1)), rank)


def _infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: {node.op_type} takes 1 input, got {len(ins)}")
    axis_of(node, len(ins[0].shape))
    return [TensorInfo(ins[0].shape, float_of(ins[0].dtype))]


def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    axis = axis_of(node, x.ndim)
    xf = x.astype(np.float64)
    shifted = xf - np.max(xf, axis=axis, keepdims=True)
    lse = np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    y = shifted - lse if node.op_type == "LogSoftmax" else np.exp(shifted - lse)
    return [y.astype(float_of(x.dtype))]


register(OpDef("Softmax", _infer, reference, arity=(1, 1), float_inputs=(0,)),
         OpDef("LogSoftmax", _infer, reference, arity=(1, 1), float_inputs=(0,)))
