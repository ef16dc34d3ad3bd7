"""Joining and cutting: Concat, Stack, Split, Slice (ONNX clamping, negative steps), Gather (negative indices).

Shape arithmetic on known values is done at infer time."""

from __future__ import annotations

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import ints, norm_axis, promote, with_value

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


# -- Split ------------------------------------------------------------------------------------------------------
def split_sizes(node: Node, shape: tuple[int, ...]) -> tuple[int, list[int]]:
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
    axis, sizes = split_sizes(node, shape)
    outs = [TensorInfo(shape[:axis] + (s,) + shape[axis + 1:], ins[0].dtype) for s in sizes]
    return with_value(node, ins, outs, _split_reference)


def _split_pieces(node: Node, x: np.ndarray) -> list[np.ndarray]:
    axis, sizes = split_sizes(node, x.shape)
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


def _split_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [p.copy() for p in _split_pieces(node, np.asarray(arrays[0]))]


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


# -- Gather ----------------------------------------------------------------------------------------------------
def _gather_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 2:
        raise ShapeError(f"{node.where()}: Gather takes (data, indices), got {len(ins)} inputs")
    data, idx = ins
    if np.dtype(idx.dtype).kind not in "iu":
        raise ShapeError(f"{node.where()}: Gather indices must be integers, got {np.dtype(idx.dtype)}")
    axis = norm_axis(node, int(node.params.get("axis", 0)), len(data.shape))
    if idx.value is not None:
        check_indices(node, np.asarray(idx.value), data.shape[axis])
    shape = data.shape[:axis] + tuple(idx.shape) + data.shape[axis + 1:]
    return with_value(node, ins, [TensorInfo(shape, data.dtype)], _gather_reference)


def check_indices(node: Node, idx: np.ndarray, dim: int) -> None:
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        raise ShapeError(f"{node.where()}: Gather index out of range [{-dim}, {dim}) "
                         f"(got {int(idx.min())}..{int(idx.max())})")


def _gather_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    data, idx = np.asarray(arrays[0]), np.asarray(arrays[1])
    axis = norm_axis(node, int(node.params.get("axis", 0)), data.ndim)
    check_indices(node, idx, data.shape[axis])
    return [np.take(data, idx.astype(np.int64), axis=axis)]


register(OpDef("Concat", _join_infer, _join_reference),
         OpDef("Stack", _join_infer, _join_reference),
         OpDef("Split", _split_infer, _split_reference),
         OpDef("Slice", _slice_infer, _slice_reference),
         OpDef("Gather", _gather_infer, _gather_reference))
