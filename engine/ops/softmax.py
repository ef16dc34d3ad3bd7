"""Softmax and LogSoftmax over one axis: a stable numpy reference and a numba kernel over an (outer, n, inner) view."""

from __future__ import annotations

import math

import numpy as np

from engine.devices.cpu.loops.normalize import softmax_loop
from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import empty, float_of, norm_axis, numba_ok, reference_kernel


def _axis(node: Node, rank: int) -> int:
    return norm_axis(node, int(node.params.get("axis", -1)), rank)


def _infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: {node.op_type} takes 1 input, got {len(ins)}")
    _axis(node, len(ins[0].shape))
    return [TensorInfo(ins[0].shape, float_of(ins[0].dtype))]


def _reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    axis = _axis(node, x.ndim)
    xf = x.astype(np.float64)
    shifted = xf - np.max(xf, axis=axis, keepdims=True)
    lse = np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    y = shifted - lse if node.op_type == "LogSoftmax" else np.exp(shifted - lse)
    return [y.astype(float_of(x.dtype))]


def _view3(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    return math.prod(shape[:axis]), (shape[axis] if shape else 1), math.prod(shape[axis + 1:])


def _kernel(node: Node, ins: list[TensorInfo]):
    if not numba_ok(ins[0].dtype):
        return reference_kernel(node, _reference)
    log = node.op_type == "LogSoftmax"
    axis = _axis(node, len(ins[0].shape))  # the rank is fixed for an instance; only the sizes vary
    softmax_loop(empty(3, ins[0].dtype), empty(3, float_of(ins[0].dtype)), log, False)

    def run(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        if x.ndim == 0:
            out[...] = 0.0 if log else 1.0
            return
        view = _view3(x.shape, axis)
        softmax_loop(np.ascontiguousarray(x).reshape(view), out.reshape(view), log, False)
    return run


register(OpDef("Softmax", _infer, _reference, _kernel), OpDef("LogSoftmax", _infer, _reference, _kernel))
