"""Joining and cutting: Concat, Stack, Split, Slice (ONNX clamping, negative steps), Gather (negative indices).

Kernels copy slices into or out of the output views; shape arithmetic on known values is done at infer time."""

from __future__ import annotations

import math

import numpy as np

from engine.devices.cpu.loops.rows import shuffle_rows
from engine.devices.cpu.threads import parallel_for
from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, get_op, register
from engine.ops.rules import empty, ints, norm_axis, numba_ok, promote, reference_kernel, with_value

_END = 2**31 - 1


# -- Concat / Stack ------------------------------------------------------------------------------------------
def _join_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if not ins:
        raise ShapeError(f"{node.where()}: {node.op_type} needs at least one input")
    stack = node.op_type == "Stack"
    rank = len(ins[0].shape)
    axis = norm_axis(node, int(node.params.get("axis", 0)), rank + 1 if stack else rank)
    for i in ins[1:]:
        a, b = list(ins[0].shape), list(i.shape)
        if not stack and len(a) == len(b):
            a[axis] = b[axis] = 0
        if a != b:
            raise ShapeError(f"{node.where()}: {node.op_type} on axis {axis} of mismatched shapes "
                             f"{', '.join(str(x.shape) for x in ins)}")
    shape = list(ins[0].shape)
    if stack:
        shape.insert(axis, len(ins))
    else:
        shape[axis] = sum(i.shape[axis] for i in ins)
    return with_value(node, ins, [TensorInfo(tuple(shape), promote(ins))], _join_reference)


def _join_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    dt = promote([TensorInfo(tuple(a.shape), a.dtype) for a in arrays])
    arrays = [np.asarray(a).astype(dt, copy=False) for a in arrays]
    fn = np.stack if node.op_type == "Stack" else np.concatenate
    return [fn(arrays, axis=int(node.params.get("axis", 0)))]


def _cuts(shape: tuple[int, ...], axis: int, widths: list[int]) -> tuple[int, int, list[tuple[int, int]]]:
    """The (outer, inner) factors of `shape` around `axis` and each piece's [start, end) of the flattened
    (outer, dim * inner) rows: a piece of a Concat/Split along `axis` is a column range of that 2-D view."""
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    bounds = np.concatenate([[0], np.cumsum(widths)]) * inner
    return outer, inner, [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _join_kernel(node: Node, ins: list[TensorInfo]):
    stack = node.op_type == "Stack"
    plans: dict[tuple, tuple] = {}  # per input shapes: (outer, column ranges); no index building per call

    def run(inputs, outputs, workspace):
        out = outputs[0]
        key = tuple(x.shape for x in inputs)
        plan = plans.get(key)
        if plan is None:
            axis = norm_axis(node, int(node.params.get("axis", 0)), out.ndim)
            widths = [1 if stack else x.shape[axis] for x in inputs]
            outer, _, cols = _cuts(out.shape, axis, widths)
            plan = plans[key] = (outer, cols)
        outer, cols = plan
        if out.size == 0:
            return
        rows = out.reshape(outer, -1)
        for x, (a, b) in zip(inputs, cols, strict=True):
            np.copyto(rows[:, a:b], x.reshape(outer, b - a), casting="unsafe")
    return run


# -- Split ------------------------------------------------------------------------------------------------------
def _split_sizes(node: Node, shape: tuple[int, ...]) -> tuple[int, list[int]]:
    axis = norm_axis(node, int(node.params.get("axis", 0)), len(shape))
    dim, n_out = shape[axis], len(node.outputs)
    if node.params.get("sizes") is None:  # torch.chunk: equal pieces of ceil(dim / n)
        step = -(-dim // n_out) if n_out else 0
        sizes = [max(0, min(step, dim - i * step)) for i in range(n_out)]
    else:
        sizes = ints(node, "sizes", node.params["sizes"])
    if sum(sizes) != dim or any(s < 0 for s in sizes) or (n_out and len(sizes) != n_out):
        raise ShapeError(f"{node.where()}: Split sizes {sizes} do not cut axis {axis} of {shape} "
                         f"into {n_out} outputs")
    return axis, sizes


def _split_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: Split takes 1 input, got {len(ins)}")
    shape = ins[0].shape
    axis, sizes = _split_sizes(node, shape)
    outs = [TensorInfo(shape[:axis] + (s,) + shape[axis + 1:], ins[0].dtype) for s in sizes]
    return with_value(node, ins, outs, _split_reference)


def _split_pieces(node: Node, x: np.ndarray) -> list[np.ndarray]:
    axis, sizes = _split_sizes(node, x.shape)
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


def _split_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [p.copy() for p in _split_pieces(node, np.asarray(arrays[0]))]


def _split_kernel(node: Node, ins: list[TensorInfo]):
    plans: dict[tuple, tuple] = {}

    def run(inputs, outputs, workspace):
        x = inputs[0]
        plan = plans.get(x.shape)
        if plan is None:
            axis, sizes = _split_sizes(node, x.shape)
            outer, _, cols = _cuts(x.shape, axis, sizes)
            plan = plans[x.shape] = (outer, cols)
        outer, cols = plan
        if x.size == 0:
            return
        rows = x.reshape(outer, -1)
        for out, (a, b) in zip(outputs, cols, strict=True):
            np.copyto(out.reshape(outer, b - a), rows[:, a:b])
    return run


# -- ChannelShuffle (registered with PixelShuffle in resize.py) ------------------------------------------------
def channel_shuffle_kernel(node: Node, ins: list[TensorInfo]):
    """A numba row copy per output channel of the (N*C, H*W) view (the op's infer checked groups divides C)."""
    groups = int(node.params["groups"])
    if not numba_ok(ins[0].dtype):
        return reference_kernel(node, get_op(node.op_type).reference)
    shuffle_rows(empty(2, ins[0].dtype), empty(2, ins[0].dtype), groups, groups, 0, 0)  # compile at build

    def run(inputs, outputs, workspace):
        x = np.ascontiguousarray(inputs[0])
        n, c = x.shape[0], x.shape[1]
        rows = n * c
        if rows == 0:
            return
        # memory-bound copies: split over the pool only for large tensors
        parallel_for(shuffle_rows, n * (c // groups), x.size // 4, x.reshape(rows, -1), outputs[0].reshape(rows, -1),
                     c, groups)
    return run


# -- Slice --------------------------------------------------------------------------------------------------------
# Optional inputs 1..3 carry starts, ends, steps as host int lists (bounds computed from shapes at run time, e.g.
# `x[:, :x.size(1) // 2]`); each one present replaces its param.
_BOUND_INPUTS = ("starts", "ends", "steps")


def slice_bounds(node: Node, arrays: list) -> dict[str, list[int]]:
    """The bounds given as inputs (input 0 excluded), by param name."""
    return {name: ints(node, name, a) for name, a in zip(_BOUND_INPUTS, arrays, strict=False)}


def slice_index(node: Node, shape: tuple[int, ...], bounds: dict | None = None) -> tuple[slice, ...]:
    """ONNX Slice semantics as python slices: negative starts/ends count from the end, then clamp."""
    p = {**node.params, **(bounds or {})}
    starts, ends = ints(node, "starts", p.get("starts")), ints(node, "ends", p.get("ends"))
    axes = list(range(len(starts))) if p.get("axes") is None else ints(node, "axes", p["axes"])
    steps = [1] * len(starts) if p.get("steps") is None else ints(node, "steps", p["steps"])
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeError(f"{node.where()}: Slice starts/ends/axes/steps lengths differ")
    index = [slice(None)] * len(shape)
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        a = norm_axis(node, a, len(shape))
        dim = shape[a]
        if st == 0:
            raise ShapeError(f"{node.where()}: Slice step 0 on axis {a}")
        s, e = s + dim if s < 0 else s, e + dim if e < 0 else e
        if st > 0:
            index[a] = slice(min(max(s, 0), dim), min(max(e, 0), dim), st)
        else:
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
            index[a] = slice(s, None if e < 0 else e, st)
    return tuple(index)


def _slice_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if not 1 <= len(ins) <= 1 + len(_BOUND_INPUTS):
        raise ShapeError(f"{node.where()}: Slice takes x and up to 3 bound inputs, got {len(ins)} inputs")
    for name, info in zip(_BOUND_INPUTS, ins[1:], strict=False):
        if info.value is None:  # the output shape depends on it
            raise ShapeError(f"{node.where()}: Slice {name} input is not known before running")
    shape = ins[0].shape
    index = slice_index(node, shape, slice_bounds(node, [i.value for i in ins[1:]]))
    out = tuple(len(range(*sl.indices(d))) for sl, d in zip(index, shape, strict=True))
    return with_value(node, ins, [TensorInfo(out, ins[0].dtype)], _slice_reference)


def _slice_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    return [x[slice_index(node, x.shape, slice_bounds(node, arrays[1:]))].copy()]


def _slice_kernel(node: Node, ins: list[TensorInfo]):
    # Bound inputs arrive as the host values of the current input signature, so they are read per call.
    def run(inputs, outputs, workspace):
        x = inputs[0]
        np.copyto(outputs[0], x[slice_index(node, x.shape, slice_bounds(node, inputs[1:]))])
    return run


# -- Gather ----------------------------------------------------------------------------------------------------
def _gather_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 2:
        raise ShapeError(f"{node.where()}: Gather takes (data, indices), got {len(ins)} inputs")
    data, idx = ins
    if np.dtype(idx.dtype).kind not in "iu":
        raise ShapeError(f"{node.where()}: Gather indices must be integers, got {np.dtype(idx.dtype)}")
    axis = norm_axis(node, int(node.params.get("axis", 0)), len(data.shape))
    if idx.value is not None:
        _check_indices(node, np.asarray(idx.value), data.shape[axis])
    shape = data.shape[:axis] + tuple(idx.shape) + data.shape[axis + 1:]
    return with_value(node, ins, [TensorInfo(shape, data.dtype)], _gather_reference)


def _check_indices(node: Node, idx: np.ndarray, dim: int) -> None:
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        raise ShapeError(f"{node.where()}: Gather index out of range [{-dim}, {dim}) "
                         f"(got {int(idx.min())}..{int(idx.max())})")


def _gather_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    data, idx = np.asarray(arrays[0]), np.asarray(arrays[1])
    axis = norm_axis(node, int(node.params.get("axis", 0)), data.ndim)
    _check_indices(node, idx, data.shape[axis])
    return [np.take(data, idx.astype(np.int64), axis=axis)]


def _gather_kernel(node: Node, ins: list[TensorInfo]):
    def run(inputs, outputs, workspace):
        data, idx = inputs
        axis = norm_axis(node, int(node.params.get("axis", 0)), data.ndim)
        _check_indices(node, idx, data.shape[axis])
        # indices are in range, so mode="wrap" only maps negatives python-style, unbuffered, into `out`
        np.take(data, idx, axis=axis, out=outputs[0], mode="wrap")
    return run


register(OpDef("Concat", _join_infer, _join_reference, _join_kernel),
         OpDef("Stack", _join_infer, _join_reference, _join_kernel),
         OpDef("Split", _split_infer, _split_reference, _split_kernel),
         OpDef("Slice", _slice_infer, _slice_reference, _slice_kernel),
         OpDef("Gather", _gather_infer, _gather_reference, _gather_kernel))
