"""CPU kernel of Softmax and LogSoftmax (engine/ops/softmax.py): a numba loop over an (outer, n, inner) view; with
oneDNN, large float32 softmaxes over the last axis run its softmax primitive (onednn/unary.py)."""

from __future__ import annotations

import math

import numpy as np

from engine.devices.cpu.kernel import Backends, CpuKernel, empty, numba_ok, reference_fallback
from engine.devices.cpu.loops.normalize import softmax_loop
from engine.devices.cpu.onednn import unary
from engine.ir import Node
from engine.ops.registry import TensorInfo
from engine.ops.rules import float_of
from engine.ops.softmax import axis_of, reference


def _view3(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    return math.prod(shape[:axis]), (shape[axis] if shape else 1), math.prod(shape[axis + 1:])


def _kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    loop = _loop_kernel(node, ins)
    shape = tuple(ins[0].shape)
    last_axis = bool(shape) and axis_of(node, len(shape)) == len(shape) - 1
    if backends.onednn and np.dtype(ins[0].dtype) == np.float32 and last_axis:
        def rows(s: tuple[int, ...]) -> tuple[int, int]:
            return math.prod(s[:-1]), s[-1]
        log = node.op_type == "LogSoftmax"
        return unary.build(unary.softmax_desc(log, 1), rows, loop, "log_softmax" if log else "softmax", shape)
    return loop


def _loop_kernel(node: Node, ins: list[TensorInfo]):
    if not numba_ok(ins[0].dtype):
        return reference_fallback(node, reference)
    log = node.op_type == "LogSoftmax"
    axis = axis_of(node, len(ins[0].shape))  # the rank is fixed for an instance; only the sizes vary
    softmax_loop(empty(3, ins[0].dtype), empty(3, float_of(ins[0].dtype)), log, False)

    def run(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        if x.ndim == 0:
            out[...] = 0.0 if log else 1.0
            return
        view = _view3(x.shape, axis)
        softmax_loop(np.ascontiguousarray(x).reshape(view), out.reshape(view), log, False)
    return run


KERNELS = {"Softmax": CpuKernel(_kernel), "LogSoftmax": CpuKernel(_kernel)}
