"""CPU kernels of the reductions and ArgMax/ArgMin (engine/ops/reduce.py): ufunc reductions straight into the
output, numba row sums for trailing axes, a numba arg-walk over an (outer, n, inner) view."""

from __future__ import annotations

import math

import numpy as np

from engine.devices.cpu.kernel import Backends, CpuKernel, empty, numba_ok, reference_fallback
from engine.devices.cpu.loops.normalize import argbest_loop
from engine.devices.cpu.loops.rows import row_sums
from engine.devices.cpu.threads import parallel_for
from engine.ir import Node
from engine.ops.reduce import REDUCERS, arg_axis, arg_reference, axes_of, out_dtype, out_shape, reduce_reference
from engine.ops.registry import TensorInfo

# Ops with a direct numpy reduction that can write into `out` (no input-sized temporary).
# (ufunc.reduce is called directly: np.mean/np.sum add tens of microseconds of python per call on small tensors)
_FAST = {"ReduceMean": np.add, "ReduceSum": np.add, "ReduceMax": np.maximum, "ReduceMin": np.minimum,
         "ReduceProd": np.multiply}


def _reduce_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    op = node.op_type
    if np.dtype(ins[0].dtype) != out_dtype(node, ins[0].dtype) or op in ("ReduceL1", "ReduceLogSumExp"):
        return reference_fallback(node, reduce_reference)  # rare: a reduced-size result, then a copy
    keepdims = bool(node.params.get("keepdims", False))
    fast = _FAST.get(op)
    rows = op in ("ReduceMean", "ReduceSum") and np.dtype(ins[0].dtype) in (np.float32, np.float64)
    if rows:  # compile at build
        row_sums(np.zeros((0, 1), ins[0].dtype), np.zeros(0, ins[0].dtype), 1.0, 0, 0)

    def run(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        axes = axes_of(node, x.ndim)
        if rows and x.size and axes and axes[0] > 0 and axes == tuple(range(axes[0], x.ndim)):
            # trailing axes (a global average pool written as mean over H, W): one vectorised sum per row
            x = np.ascontiguousarray(x)
            n_rows = math.prod(x.shape[:axes[0]])
            width = x.size // n_rows
            parallel_for(row_sums, n_rows, x.size // 4, x.reshape(n_rows, width), out.reshape(n_rows),
                         1.0 / width if op == "ReduceMean" else 1.0)
            return
        if fast is not None:
            fast.reduce(x, axis=axes, out=out, keepdims=keepdims)
            if op == "ReduceMean":  # over no elements (a data-dependent extent of 0): NaN, as torch.mean
                out *= out.dtype.type(out.size / x.size) if x.size else out.dtype.type(np.nan)
            return
        if op == "ReduceLogSum":
            np.sum(x, axis=axes, out=out, keepdims=keepdims)
            with np.errstate(divide="ignore", invalid="ignore"):
                np.log(out, out=out)
            return
        # sum of squares as an einsum of x with itself: no squared copy of x
        letters = "abcdefghijklmnopqrstuvwxyz"[:x.ndim]
        kept = "".join(c for i, c in enumerate(letters) if i not in axes)
        np.einsum(f"{letters},{letters}->{kept}", x, x, out=out.reshape(out_shape(x.shape, axes, False)))
        if op == "ReduceL2":
            np.sqrt(out, out=out)
    return run


def _arg_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    # numba walk over an (outer, n, inner) view: numpy's argmax over a middle axis copies the whole input
    largest = node.op_type == "ArgMax"
    if not numba_ok(ins[0].dtype):
        return reference_fallback(node, arg_reference)
    argbest_loop(empty(3, ins[0].dtype), empty(2, np.int64), largest)

    def run(inputs, outputs, workspace):
        x = np.ascontiguousarray(inputs[0])
        axis = arg_axis(node, x.ndim)
        if axis is None or x.ndim == 0:
            view = (1, x.size, 1)
        else:
            view = (math.prod(x.shape[:axis]), x.shape[axis], -1)
        argbest_loop(x.reshape(view), outputs[0].reshape(view[0], -1), largest)
    return run


KERNELS = {**{name: CpuKernel(_reduce_kernel) for name in REDUCERS},
           **{name: CpuKernel(_arg_kernel) for name in ("ArgMax", "ArgMin")}}
