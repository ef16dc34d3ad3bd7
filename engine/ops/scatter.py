"""Writes into a copy of a tensor: SliceAssign (`x[1:3, ::2] = src`, torch's slice_scatter / select_scatter /
copy_ and pnnx's Tensor.slice_copy), IndexPut (`x[idx] = v`, `x[mask] = v`, index_put with accumulate) and
ScatterElements (ONNX's, torch.scatter: an index of updates' shape giving each update's coordinate on one axis).

Both are functional: the output is a new tensor and input 0 is never changed, so a value read before the write
keeps its old contents however the graph orders its readers. `inplace` lets the planner give the output input
0's buffer when nothing reads input 0 afterwards, which is what makes them cheap.
"""

from __future__ import annotations

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import BOOL, norm_axis
from engine.ops.tensor import slice_bounds, slice_index


# -- SliceAssign -------------------------------------------------------------------------------------------------
def region_index(node: Node, shape: tuple[int, ...], bounds: dict | None = None) -> tuple:
    """The numpy index of the written region: Slice's (ONNX clamping) with the `drop_axes` (selects) indexed by
    their start alone, so they leave the region as `x[:, 1]` does. No axes: the whole tensor (copy_)."""
    if not bounds and not node.params.get("axes"):
        return (slice(None),) * len(shape)
    index = list(slice_index(node, shape, bounds))
    p = {**node.params, **(bounds or {})}
    axes = list(p.get("axes") or range(len(p.get("starts") or [])))
    starts = [int(s) for s in p.get("starts") or []]
    for a in node.params.get("drop_axes") or []:
        a = norm_axis(node, int(a), len(shape))
        at = [norm_axis(node, int(b), len(shape)) for b in axes].index(a)
        i, dim = starts[at], shape[a]
        if not -dim <= i < dim:
            raise ShapeError(f"{node.where()}: SliceAssign index {i} out of range for dim {a} of size {dim}")
        index[a] = i % dim
    return tuple(index)


def _region_shape(index: tuple, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(len(range(*sl.indices(d))) for sl, d in zip(index, shape, strict=True) if isinstance(sl, slice))


def _slice_assign_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if not 2 <= len(ins) <= 5:
        raise ShapeError(f"{node.where()}: SliceAssign takes (x, src) and up to 3 bound inputs, got {len(ins)}")
    for info in ins[2:]:
        if info.value is None:
            raise ShapeError(f"{node.where()}: SliceAssign bound input is not known before running")
    x, src = ins[0], ins[1]
    _check_src(node, src, x)
    region = _region_shape(region_index(node, x.shape, slice_bounds(node, [i.value for i in ins[2:]])), x.shape)
    rule = node.params.get("src", "broadcast")
    fits = (tuple(src.shape) == region if rule == "exact" else
            _broadcasts(src.shape, region) and (rule != "copy" or len(src.shape) <= len(region)))
    if not fits:
        raise ShapeError(f"{node.where()}: SliceAssign source {src.shape} does not fit the written region {region} "
                         f"of {x.shape} ({rule})")
    return [TensorInfo(x.shape, x.dtype)]


def _check_src(node: Node, src: TensorInfo, x: TensorInfo) -> None:
    # torch's copy_ casts any source to the target's dtype; only a float source into an integer or bool target
    # loses information torch would also lose, so every pairing is allowed but a non-numeric one.
    for info in (src, x):
        if np.dtype(info.dtype).kind not in "biuf":
            raise ShapeError(f"{node.where()}: {node.op_type} of dtype {np.dtype(info.dtype)}")


def _broadcasts(src: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(src) > len(target):
        return all(d == 1 for d in src[: len(src) - len(target)]) and _broadcasts(src[len(src) - len(target):],
                                                                                  target)
    return all(s in (1, t) for s, t in zip(reversed(src), reversed(target), strict=False))


def slice_assign_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x, src = np.asarray(arrays[0]), np.asarray(arrays[1])
    out = x.copy()
    index = region_index(node, x.shape, slice_bounds(node, arrays[2:]))
    region = out[index]
    out[index] = np.broadcast_to(src, np.shape(region)).astype(x.dtype, copy=False)
    return [out]


# -- IndexPut ----------------------------------------------------------------------------------------------------
def _index_put_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) < 3:
        raise ShapeError(f"{node.where()}: IndexPut takes (x, values, index, ...), got {len(ins)} inputs")
    x, values, indices = ins[0], ins[1], ins[2:]
    _check_src(node, values, x)
    kinds = {np.dtype(i.dtype).kind for i in indices}
    if kinds - set("ib") or ("b" in kinds and len(indices) > 1):  # uint8 masks: deprecated in torch, refused
        raise ShapeError(f"{node.where()}: IndexPut indices must be integer tensors or one bool mask, got "
                         f"{', '.join(str(np.dtype(i.dtype)) for i in indices)}")
    if len(indices) > len(x.shape):
        raise ShapeError(f"{node.where()}: IndexPut has {len(indices)} indices for a rank-{len(x.shape)} tensor")
    rest = x.shape[len(indices):]
    if kinds == {"b"}:
        mask = indices[0].shape
        if len(mask) > len(x.shape) or mask != x.shape[: len(mask)]:
            raise ShapeError(f"{node.where()}: IndexPut mask {mask} does not match the leading dims of {x.shape}")
        rest = x.shape[len(mask):]
        # the region is (number of True elements,) + rest; that number is only known at run time
        lead = values.shape[0] if len(values.shape) == len(rest) + 1 else 1
        region = (lead,) + rest
    else:
        try:
            region = tuple(np.broadcast_shapes(*[i.shape for i in indices])) + rest
        except ValueError:
            raise ShapeError(f"{node.where()}: IndexPut index shapes "
                             f"{', '.join(str(i.shape) for i in indices)} do not broadcast") from None
    if not _broadcasts(values.shape, region):
        raise ShapeError(f"{node.where()}: IndexPut values {values.shape} do not broadcast to the indexed "
                         f"region {region}")
    return [TensorInfo(x.shape, x.dtype)]


def index_put_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    out = np.asarray(arrays[0]).copy()
    index_put_into(node, out, np.asarray(arrays[1]), [np.asarray(a) for a in arrays[2:]])
    return [out]


def index_put_into(node: Node, out: np.ndarray, values: np.ndarray, indices: list[np.ndarray]) -> None:
    """Writes (or, with accumulate, adds) `values` at `indices` of `out`, checking the indices' range and the
    values' shape against the actual data."""
    index = _index(node, out.shape, indices)
    region = np.shape(out[index])
    try:
        values = np.broadcast_to(values, region).astype(out.dtype, copy=False)
    except ValueError:
        raise ShapeError(f"{node.where()}: IndexPut values {values.shape} do not broadcast to the indexed region "
                         f"{region}") from None
    if node.params.get("accumulate"):
        np.add.at(out, index, values)
    else:
        out[index] = values


def _index(node: Node, shape: tuple[int, ...], indices: list[np.ndarray]) -> tuple:
    if indices[0].dtype == BOOL:
        return (indices[0],)
    for axis, idx in enumerate(indices):
        dim = shape[axis]
        if idx.size and (idx.min() < -dim or idx.max() >= dim):
            raise ShapeError(f"{node.where()}: IndexPut index out of range [{-dim}, {dim}) on dim {axis} "
                             f"(got {int(idx.min())}..{int(idx.max())})")
    return tuple(idx.astype(np.int64) for idx in indices)


# -- ScatterElements -------------------------------------------------------------------------------------------
REDUCTIONS = ("none", "add")


def _scatter_elements_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 3:
        raise ShapeError(f"{node.where()}: ScatterElements takes (x, index, updates), got {len(ins)} inputs")
    x, idx, upd = ins
    if np.dtype(idx.dtype).kind not in "iu":
        raise ShapeError(f"{node.where()}: ScatterElements index must be integers, got {np.dtype(idx.dtype)}")
    if node.params.get("reduction", "none") not in REDUCTIONS:
        raise ShapeError(f"{node.where()}: ScatterElements reduction {node.params.get('reduction')!r}")
    if tuple(idx.shape) != tuple(upd.shape) or len(idx.shape) != len(x.shape):
        raise ShapeError(f"{node.where()}: ScatterElements index {idx.shape} and updates {upd.shape} must have "
                         f"one shape, of x's rank ({x.shape})")
    axis = norm_axis(node, int(node.params.get("axis", 0)), len(x.shape))
    if any(i > d for a, (i, d) in enumerate(zip(idx.shape, x.shape, strict=True)) if a != axis):
        raise ShapeError(f"{node.where()}: ScatterElements index {idx.shape} is larger than x {x.shape} off "
                         f"axis {axis}")
    if idx.value is not None:
        _scatter_positions(node, np.asarray(idx.value), x.shape)
    return [TensorInfo(x.shape, x.dtype)]


def _scatter_positions(node: Node, idx: np.ndarray, shape: tuple[int, ...]) -> tuple:
    """The numpy index of every written element: index[i, j, ...] replaces the axis coordinate of (i, j, ...);
    negative indices count from the end, out of range is an error."""
    axis = norm_axis(node, int(node.params.get("axis", 0)), len(shape))
    dim = shape[axis]
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        raise ShapeError(f"{node.where()}: ScatterElements index out of range [{-dim}, {dim}) on dim {axis} "
                         f"(got {int(idx.min())}..{int(idx.max())})")
    grid = list(np.indices(idx.shape, sparse=True))
    grid[axis] = np.where(idx < 0, idx + dim, idx).astype(np.int64)
    return tuple(grid)


def scatter_elements_into(node: Node, out: np.ndarray, idx: np.ndarray, updates: np.ndarray) -> None:
    """out[position of each index element] = (or, reduction add, +=) the matching update, in index order: with
    repeated positions the last write wins, or every one adds up."""
    where = _scatter_positions(node, np.asarray(idx), out.shape)
    values = np.asarray(updates).astype(out.dtype, copy=False)
    if node.params.get("reduction", "none") == "add":
        np.add.at(out, where, values)
    else:
        out[where] = values


def scatter_elements_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    out = np.asarray(arrays[0]).copy()
    scatter_elements_into(node, out, arrays[1], arrays[2])
    return [out]


register(OpDef("ScatterElements", _scatter_elements_infer, scatter_elements_reference, inplace=True,
               arity=(3, 3)))
register(OpDef("SliceAssign", _slice_assign_infer, slice_assign_reference, inplace=True, arity=(2, 5)),
         OpDef("IndexPut", _index_put_infer, index_put_reference, inplace=True, arity=(3, 64)))
