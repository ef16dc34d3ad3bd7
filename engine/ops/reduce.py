"""Reductions over a list of axes (None or [] = all; negative axes; keepdims), ReduceVar (torch.var / std with
their correction), ArgMax/ArgMin (int64 out) and CumSum (a running sum along one axis)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import INT64, float_of, norm_axes, norm_axis, with_value


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


def out_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def out_dtype(node: Node, dt: np.dtype) -> np.dtype:
    dt = np.dtype(dt)
    if REDUCERS[node.op_type][1]:
        return float_of(dt)
    if dt.kind == "b" and node.op_type not in ("ReduceMax", "ReduceMin"):
        return INT64  # torch sums booleans as int64
    return dt


def axes_of(node: Node, rank: int) -> tuple[int, ...]:
    return norm_axes(node, node.params.get("axes"), rank)


def _reduce_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: {node.op_type} takes 1 input, got {len(ins)}")
    shape = ins[0].shape
    axes = axes_of(node, len(shape))
    if node.op_type in ("ReduceMax", "ReduceMin") and any(shape[a] == 0 for a in axes):
        raise ShapeError(f"{node.where()}: {node.op_type} over an empty axis of {shape}")
    out = TensorInfo(out_shape(shape, axes, bool(node.params.get("keepdims", False))), out_dtype(node, ins[0].dtype))
    return with_value(node, ins, [out], reduce_reference)


def reduce_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    axes = axes_of(node, x.ndim)
    ot = out_dtype(node, x.dtype)
    data = x.astype(np.float64) if ot.kind == "f" else x.astype(ot)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.asarray(REDUCERS[node.op_type][0](data, axes))
    shape = out_shape(x.shape, axes, bool(node.params.get("keepdims", False)))
    return [y.astype(ot).reshape(shape)]


# -- ArgMax / ArgMin ------------------------------------------------------------------------------------------
def arg_axis(node: Node, rank: int) -> int | None:
    axis = node.params.get("axis")
    return None if axis is None else norm_axis(node, int(axis), rank)


def _arg_shape(node: Node, shape: tuple[int, ...]) -> tuple[int, ...]:
    axis, keep = arg_axis(node, len(shape)), bool(node.params.get("keepdims", False))
    if axis is None:
        return (1,) * len(shape) if keep else ()
    return out_shape(shape, (axis,), keep)


def _arg_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: {node.op_type} takes 1 input, got {len(ins)}")
    if ins[0].dtype == np.bool_:
        raise ShapeError(f"{node.where()}: {node.op_type} of bool (torch has no argmax of bools)")
    shape, axis = ins[0].shape, arg_axis(node, len(ins[0].shape))
    if (shape[axis] if axis is not None and shape else math.prod(shape)) == 0:
        raise ShapeError(f"{node.where()}: {node.op_type} over an empty axis of {shape}")
    return with_value(node, ins, [TensorInfo(_arg_shape(node, ins[0].shape), INT64)], arg_reference)


def arg_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    fn = np.argmax if node.op_type == "ArgMax" else np.argmin
    axis = arg_axis(node, x.ndim)
    y = fn(x.reshape(-1)) if axis is None else fn(x, axis=axis)
    return [np.asarray(y, dtype=np.int64).reshape(_arg_shape(node, x.shape))]


# -- ReduceVar ------------------------------------------------------------------------------------------------
def _var_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: ReduceVar takes 1 input, got {len(ins)}")
    if np.dtype(ins[0].dtype).kind != "f":
        raise ShapeError(f"{node.where()}: ReduceVar of {np.dtype(ins[0].dtype)} (torch.var takes floats only)")
    shape = ins[0].shape
    out = out_shape(shape, axes_of(node, len(shape)), bool(node.params.get("keepdims", False)))
    return with_value(node, ins, [TensorInfo(out, ins[0].dtype)], var_reference)


def var_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    axes = axes_of(node, x.ndim)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.var(x.astype(np.float64), axis=axes, ddof=float(node.params.get("correction", 1)))
    return [np.asarray(y).astype(x.dtype).reshape(out_shape(x.shape, axes, bool(node.params.get("keepdims"))))]


# -- CumSum ------------------------------------------------------------------------------------------------------
def cumsum_dtype(dt: np.dtype) -> np.dtype:
    return np.dtype(dt) if np.dtype(dt).kind == "f" else INT64  # torch sums integers and bools as int64


def _cumsum_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: CumSum takes 1 input, got {len(ins)}")
    norm_axis(node, int(node.params.get("axis", 0)), len(ins[0].shape))
    return with_value(node, ins, [TensorInfo(ins[0].shape, cumsum_dtype(ins[0].dtype))], cumsum_reference)


def cumsum_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    ot = cumsum_dtype(x.dtype)
    if x.ndim == 0:
        return [x.astype(ot)]
    axis = norm_axis(node, int(node.params.get("axis", 0)), x.ndim)
    return [np.cumsum(x.astype(np.float64 if ot.kind == "f" else ot), axis=axis).astype(ot)]


# torch.mean, norm(p=2) and log(sum) refuse integers; sum, prod, amax, amin, logsumexp and L1 take them.
FLOAT_ONLY = {"ReduceMean", "ReduceL2", "ReduceLogSum"}
# Reductions follow a data-dependent extent (engine/runtime/extents.py): over its axis they read only the live
# rows (an empty one: sum 0, mean NaN, prod 1, as torch; max and min raise at that run, as torch does).
register(*[OpDef(name, _reduce_infer, reduce_reference, arity=(1, 1), float_inputs=(0,) if name in FLOAT_ONLY else (),
                 follows_extent=True) for name in REDUCERS])
register(OpDef("ReduceVar", _var_infer, var_reference, arity=(1, 1), float_inputs=(0,)),
         OpDef("CumSum", _cumsum_infer, cumsum_reference, arity=(1, 1)))
register(*[OpDef(name, _arg_infer, arg_reference, arity=(1, 1)) for name in ("ArgMax", "ArgMin")])
