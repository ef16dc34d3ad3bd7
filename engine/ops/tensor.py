"""Joining and cutting: Concat, Stack, Split, Slice (ONNX clamping, negative steps), Gather (negative indices),
Index (torch's advanced indexing by integer tensors, `x[rows, cols]`), GatherElements (torch.gather),
RepeatInterleave, and Trilu (the lower or upper triangle of the last two dims).

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


def check_indices(node: Node, idx: np.ndarray, dim: int, axis: int | None = None) -> None:
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        on = "" if axis is None else f" on dim {axis}"
        raise ShapeError(f"{node.where()}: {node.op_type} index out of range [{-dim}, {dim}){on} "
                         f"(got {int(idx.min())}..{int(idx.max())})")


def _gather_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    data, idx = np.asarray(arrays[0]), np.asarray(arrays[1])
    axis = norm_axis(node, int(node.params.get("axis", 0)), data.ndim)
    check_indices(node, idx, data.shape[axis])
    return [np.take(data, idx.astype(np.int64), axis=axis)]


# -- Index ---------------------------------------------------------------------------------------------------
def index_dims(node: Node, rank: int, k: int) -> list[int]:
    """The dims the k index tensors index (param `dims`, default the leading k): distinct and ascending, as the
    positions of torch's index list (`x[:, rows, cols]` indexes dims 1 and 2)."""
    dims = [int(d) for d in node.params.get("dims") or range(k)]
    if len(dims) != k or any(not 0 <= d < rank for d in dims) or dims != sorted(set(dims)):
        raise ShapeError(f"{node.where()}: Index dims {dims} do not fit {k} indices of a rank-{rank} tensor")
    return dims


def index_shape(shape: tuple[int, ...], dims: list[int], lead: tuple[int, ...]) -> tuple[int, ...]:
    """numpy's (and torch's) rule: indexed dims next to each other are replaced in place by the indices'
    broadcast shape; indexed dims apart put it first."""
    rest = tuple(d for a, d in enumerate(shape) if a not in dims)
    if dims == list(range(dims[0], dims[0] + len(dims))):
        return shape[:dims[0]] + lead + shape[dims[-1] + 1:]
    return lead + rest


def _index_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) < 2:
        raise ShapeError(f"{node.where()}: Index takes (data, index, ...), got {len(ins)} inputs")
    data, indices = ins[0], ins[1:]
    for i in indices:
        # torch indexes with int64 or int32; a bool mask picks a run-time number of elements: the lowering makes it
        # NonZero rows (engine/ops/data_dependent.py), a uint8 one (deprecated in torch) is refused
        if np.dtype(i.dtype) not in (np.dtype(np.int64), np.dtype(np.int32)):
            raise ShapeError(f"{node.where()}: Index indices must be int64 or int32 tensors, got "
                             f"{', '.join(str(np.dtype(i.dtype)) for i in indices)}")
    dims = index_dims(node, len(data.shape), len(indices))
    for d, i in zip(dims, indices, strict=True):
        if i.value is not None:
            check_indices(node, np.asarray(i.value), data.shape[d], d)
    try:
        lead = tuple(np.broadcast_shapes(*[tuple(i.shape) for i in indices]))
    except ValueError:
        raise ShapeError(f"{node.where()}: Index index shapes {', '.join(str(i.shape) for i in indices)} "
                         "do not broadcast") from None
    return with_value(node, ins, [TensorInfo(index_shape(data.shape, dims, lead), data.dtype)], index_reference)


def index_tuple(node: Node, shape: tuple[int, ...], indices: list[np.ndarray]) -> tuple:
    """The numpy index of torch's `x[..., idx0, ..., idx1]`: full slices but on `dims`, the indices checked against
    the actual dims (negative ones count from the end, as in torch)."""
    dims = index_dims(node, len(shape), len(indices))
    index: list = [slice(None)] * (dims[-1] + 1)
    for d, idx in zip(dims, indices, strict=True):
        check_indices(node, idx, shape[d], d)
        index[d] = np.asarray(idx).astype(np.int64, copy=False)
    return tuple(index)


def index_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    data = np.asarray(arrays[0])
    return [np.array(data[index_tuple(node, data.shape, [np.asarray(a) for a in arrays[1:]])])]


# -- GatherElements ------------------------------------------------------------------------------------------
def _gather_elements_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 2:
        raise ShapeError(f"{node.where()}: GatherElements takes (data, index), got {len(ins)} inputs")
    data, idx = ins
    if np.dtype(idx.dtype).kind not in "iu":
        raise ShapeError(f"{node.where()}: GatherElements index must be integers, got {np.dtype(idx.dtype)}")
    if len(idx.shape) != len(data.shape):
        raise ShapeError(f"{node.where()}: GatherElements index {idx.shape} and data {data.shape} differ in rank")
    axis = norm_axis(node, int(node.params.get("axis", 0)), len(data.shape))
    if any(i > d for a, (i, d) in enumerate(zip(idx.shape, data.shape, strict=True)) if a != axis):
        raise ShapeError(f"{node.where()}: GatherElements index {idx.shape} is larger than data {data.shape} "
                         f"off axis {axis}")
    if idx.value is not None:
        _check_gather_elements(node, np.asarray(idx.value), data.shape[axis])
    return with_value(node, ins, [TensorInfo(tuple(idx.shape), data.dtype)], _gather_elements_reference)


def _check_gather_elements(node: Node, idx: np.ndarray, dim: int) -> None:
    if idx.size and (idx.min() < 0 or idx.max() >= dim):  # torch.gather takes no negative index
        raise ShapeError(f"{node.where()}: GatherElements index out of range [0, {dim}) "
                         f"(got {int(idx.min())}..{int(idx.max())})")


def _gather_elements_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    data, idx = np.asarray(arrays[0]), np.asarray(arrays[1])
    axis = norm_axis(node, int(node.params.get("axis", 0)), data.ndim)
    _check_gather_elements(node, idx, data.shape[axis])
    idx = idx.astype(np.int64)
    # torch.gather reads data at the index's extent off the axis (smaller than data's is allowed)
    view = data[tuple(slice(0, n) if a != axis else slice(None) for a, n in enumerate(idx.shape))]
    return [np.take_along_axis(view, idx, axis=axis)]


# -- RepeatInterleave ----------------------------------------------------------------------------------------
def _repeats(node: Node, dim: int) -> np.ndarray:
    reps = np.asarray(node.params.get("repeats"))
    if reps.dtype.kind not in "iu" or reps.ndim > 1 or (reps.ndim == 1 and reps.size not in (1, dim)) \
            or (reps < 0).any():
        raise ShapeError(f"{node.where()}: RepeatInterleave repeats {node.params.get('repeats')!r} do not fit "
                         f"a dim of {dim}")
    return reps.reshape(-1) if reps.ndim == 1 and reps.size == dim else np.full(dim, int(reps.reshape(-1)[0]))


def _repeat_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: RepeatInterleave takes 1 input, got {len(ins)}")
    shape = list(ins[0].shape)
    axis = norm_axis(node, int(node.params.get("axis", 0)), len(shape))
    shape[axis] = int(_repeats(node, shape[axis]).sum())
    return with_value(node, ins, [TensorInfo(tuple(shape), ins[0].dtype)], _repeat_reference)


def _repeat_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    axis = norm_axis(node, int(node.params.get("axis", 0)), x.ndim)
    return [np.repeat(x, _repeats(node, x.shape[axis]), axis=axis)]


# -- Trilu -----------------------------------------------------------------------------------------------------
def _trilu_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: Trilu takes 1 input, got {len(ins)}")
    if len(ins[0].shape) < 2:
        raise ShapeError(f"{node.where()}: Trilu of a {len(ins[0].shape)}-D tensor (needs at least 2 dims)")
    return with_value(node, ins, [TensorInfo(ins[0].shape, ins[0].dtype)], _trilu_reference)


def _trilu_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    fn = np.triu if node.params.get("upper") else np.tril
    return [fn(np.asarray(arrays[0]), int(node.params.get("k", 0)))]


register(OpDef("Index", _index_infer, index_reference, arity=(2, 64), follows_extent=True),
         OpDef("GatherElements", _gather_elements_infer, _gather_elements_reference, arity=(2, 2)),
         OpDef("RepeatInterleave", _repeat_infer, _repeat_reference, arity=(1, 1)),
         OpDef("Trilu", _trilu_infer, _trilu_reference, arity=(1, 1)))
register(OpDef("Concat", _join_infer, _join_reference, arity=(1, 1 << 16), follows_extent=True),
         OpDef("Stack", _join_infer, _join_reference, arity=(1, 1 << 16), follows_extent=True),
         OpDef("Split", _split_infer, _split_reference, arity=(1, 1), follows_extent=True),
         OpDef("Slice", _slice_infer, _slice_reference, arity=(1, 4), follows_extent=True),
         OpDef("Gather", _gather_infer, _gather_reference, arity=(2, 2), follows_extent=True))
