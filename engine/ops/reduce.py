"""Reductions over a list of axes (None or [] = all; negative axes; keepdims) and ArgMax/ArgMin (int64 out)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from engine.devices.cpu.loops.normalize import argbest_loop
from engine.devices.cpu.loops.rows import row_sums
from engine.devices.cpu.threads import parallel_for
from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import INT64, empty, float_of, norm_axes, norm_axis, numba_ok, reference_kernel, with_value


def _logsumexp(x: np.ndarray, axis: tuple[int, ...]) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    return (np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m).squeeze(axis)


# name -> (numpy function(x, axis) on float64 data, floats only?)
REDUCERS: dict[str, tuple[Callable[[np.ndarray, tuple[int, ...]], np.ndarray], bool]] = {
    "ReduceMean": (lambda x, a: np.mean(x, axis=a), True),
    "ReduceSum": (lambda x, a: np.sum(x, axis=a), False),
    "ReduceMax": (lambda x, a: np.max(x, axis=a), False),
    "ReduceMin": (lambda x, a: np.min(x, axis=a), False),
    "ReduceProd": (lambda x, a: np.prod(x, axis=a), False),
    "ReduceL1": (lambda x, a: np.sum(np.abs(x), axis=a), False),
    "ReduceL2": (lambda x, a: np.sqrt(np.sum(x * x, axis=a)), True),
    "ReduceSumSquare": (lambda x, a: np.sum(x * x, axis=a), False),
    "ReduceLogSum": (lambda x, a: np.log(np.sum(x, axis=a)), True),
    "ReduceLogSumExp": (_logsumexp, True),
}
# Ops with a direct numpy reduction that can write into `out` (no input-sized temporary).
# (ufunc.reduce is called directly: np.mean/np.sum add tens of microseconds of python per call on small tensors)
_FAST = {"ReduceMean": np.add, "ReduceSum": np.add, "ReduceMax": np.maximum, "ReduceMin": np.minimum,
         "ReduceProd": np.multiply}


def _out_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _out_dtype(node: Node, dt: np.dtype) -> np.dtype:
    dt = np.dtype(dt)
    if REDUCERS[node.op_type][1]:
        return float_of(dt)
    if dt.kind == "b" and node.op_type not in ("ReduceMax", "ReduceMin"):
        return INT64  # torch sums booleans as int64
    return dt


def _axes(node: Node, rank: int) -> tuple[int, ...]:
    return norm_axes(node, node.params.get("axes"), rank)


def _reduce_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: {node.op_type} takes 1 input, got {len(ins)}")
    shape = ins[0].shape
    axes = _axes(node, len(shape))
    if node.op_type in ("ReduceMax", "ReduceMin") and any(shape[a] == 0 for a in axes):
        raise ShapeError(f"{node.where()}: {node.op_type} over an empty axis of {shape}")
    out = TensorInfo(_out_shape(shape, axes, bool(node.params.get("keepdims", False))), _out_dtype(node, ins[0].dtype))
    return with_value(node, ins, [out], _reduce_reference)


def _reduce_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    axes = _axes(node, x.ndim)
    ot = _out_dtype(node, x.dtype)
    data = x.astype(np.float64) if ot.kind == "f" else x.astype(ot)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.asarray(REDUCERS[node.op_type][0](data, axes))
    shape = _out_shape(x.shape, axes, bool(node.params.get("keepdims", False)))
    return [y.astype(ot).reshape(shape)]


def _reduce_kernel(node: Node, ins: list[TensorInfo]):
    op = node.op_type
    if np.dtype(ins[0].dtype) != _out_dtype(node, ins[0].dtype) or op in ("ReduceL1", "ReduceLogSumExp"):
        return reference_kernel(node, _reduce_reference)  # rare: a reduced-size result, then a copy
    keepdims = bool(node.params.get("keepdims", False))
    fast = _FAST.get(op)
    rows = op in ("ReduceMean", "ReduceSum") and np.dtype(ins[0].dtype) in (np.float32, np.float64)
    if rows:  # compile at build
        row_sums(np.zeros((0, 1), ins[0].dtype), np.zeros(0, ins[0].dtype), 1.0, 0, 0)

    def run(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        axes = _axes(node, x.ndim)
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
            if op == "ReduceMean":
                out *= out.dtype.type(out.size / max(x.size, 1))
            return
        if op == "ReduceLogSum":
            np.sum(x, axis=axes, out=out, keepdims=keepdims)
            with np.errstate(divide="ignore", invalid="ignore"):
                np.log(out, out=out)
            return
        # sum of squares as an einsum of x with itself: no squared copy of x
        letters = "abcdefghijklmnopqrstuvwxyz"[:x.ndim]
        kept = "".join(c for i, c in enumerate(letters) if i not in axes)
        np.einsum(f"{letters},{letters}->{kept}", x, x, out=out.reshape(_out_shape(x.shape, axes, False)))
        if op == "ReduceL2":
            np.sqrt(out, out=out)
    return run


# -- ArgMax / ArgMin ------------------------------------------------------------------------------------------
def _arg_axis(node: Node, rank: int) -> int | None:
    axis = node.params.get("axis")
    return None if axis is None else norm_axis(node, int(axis), rank)


def _arg_shape(node: Node, shape: tuple[int, ...]) -> tuple[int, ...]:
    axis, keep = _arg_axis(node, len(shape)), bool(node.params.get("keepdims", False))
    if axis is None:
        return (1,) * len(shape) if keep else ()
    return _out_shape(shape, (axis,), keep)


def _arg_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: {node.op_type} takes 1 input, got {len(ins)}")
    shape, axis = ins[0].shape, _arg_axis(node, len(ins[0].shape))
    if (shape[axis] if axis is not None and shape else math.prod(shape)) == 0:
        raise ShapeError(f"{node.where()}: {node.op_type} over an empty axis of {shape}")
    return with_value(node, ins, [TensorInfo(_arg_shape(node, ins[0].shape), INT64)], _arg_reference)


def _arg_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    fn = np.argmax if node.op_type == "ArgMax" else np.argmin
    axis = _arg_axis(node, x.ndim)
    y = fn(x.reshape(-1)) if axis is None else fn(x, axis=axis)
    return [np.asarray(y, dtype=np.int64).reshape(_arg_shape(node, x.shape))]


def _arg_kernel(node: Node, ins: list[TensorInfo]):
    # numba walk over an (outer, n, inner) view: numpy's argmax over a middle axis copies the whole input
    largest = node.op_type == "ArgMax"
    if not numba_ok(ins[0].dtype):
        return reference_kernel(node, _arg_reference)
    argbest_loop(empty(3, ins[0].dtype), empty(2, np.int64), largest)

    def run(inputs, outputs, workspace):
        x = np.ascontiguousarray(inputs[0])
        axis = _arg_axis(node, x.ndim)
        if axis is None or x.ndim == 0:
            view = (1, x.size, 1)
        else:
            view = (math.prod(x.shape[:axis]), x.shape[axis], -1)
        argbest_loop(x.reshape(view), outputs[0].reshape(view[0], -1), largest)
    return run


register(*[OpDef(name, _reduce_infer, _reduce_reference, _reduce_kernel) for name in REDUCERS])
register(*[OpDef(name, _arg_infer, _arg_reference, _arg_kernel) for name in ("ArgMax", "ArgMin")])
