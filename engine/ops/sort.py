"""TopK (torch.topk): the k largest (or smallest) elements along an axis and their int64 indices; Sort
(torch.sort, torch.argsort): the whole axis in order and the int64 indices that order it."""

from __future__ import annotations

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import INT64, norm_axis, with_value


def _axis_k(node: Node, shape: tuple[int, ...]) -> tuple[int, int]:
    axis = norm_axis(node, int(node.params.get("axis", -1)), len(shape))
    k, dim = int(node.params.get("k", 1)), shape[axis] if shape else 1
    if not 0 <= k <= dim:
        raise ShapeError(f"{node.where()}: TopK k={k} out of range for a dim of {dim}")
    return axis, k


def _topk_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: TopK takes 1 input, got {len(ins)}")
    if np.dtype(ins[0].dtype).kind not in "iuf":
        raise ShapeError(f"{node.where()}: TopK of {np.dtype(ins[0].dtype)}")
    shape = list(ins[0].shape)
    axis, k = _axis_k(node, ins[0].shape)
    if shape:
        shape[axis] = k
    outs = [TensorInfo(tuple(shape), ins[0].dtype), TensorInfo(tuple(shape), INT64)]
    return with_value(node, ins, outs, topk_reference)


def topk_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """A stable sort: among equal values the lower index comes first (torch leaves the order of ties open)."""
    x = np.asarray(arrays[0])
    axis, k = _axis_k(node, x.shape)
    return _first(x, axis, k, bool(node.params.get("largest", True)))


def _first(x: np.ndarray, axis: int, k: int, largest: bool) -> list[np.ndarray]:
    """The first k of x along `axis`, largest (or smallest) first, stably, and their int64 indices."""
    if x.ndim == 0:
        return [x.copy(), np.zeros((), np.int64)]
    key = -x if largest else x
    if x.dtype.kind == "f":  # NaN is the largest value for torch, so it comes first when largest
        key = np.where(np.isnan(x), -np.inf if largest else np.inf, key)
    order = np.argsort(key, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return [np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)]


def _sort_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if np.dtype(ins[0].dtype).kind not in "iuf":
        raise ShapeError(f"{node.where()}: Sort of {np.dtype(ins[0].dtype)}")
    norm_axis(node, int(node.params.get("axis", -1)), len(ins[0].shape))
    outs = [TensorInfo(ins[0].shape, ins[0].dtype), TensorInfo(ins[0].shape, INT64)]
    return with_value(node, ins, outs, sort_reference)


def sort_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Ascending, or descending with `descending`; stable (ties keep their order, as torch's stable=True)."""
    x = np.asarray(arrays[0])
    axis = norm_axis(node, int(node.params.get("axis", -1)), x.ndim)
    return _first(x, axis, x.shape[axis] if x.ndim else 1, bool(node.params.get("descending", False)))


# follows a data-dependent extent; a run whose extent is below k fails, as torch.topk raises (extents.py)
register(OpDef("TopK", _topk_infer, topk_reference, arity=(1, 1), follows_extent=True),
         OpDef("Sort", _sort_infer, sort_reference, arity=(1, 1), follows_extent=True))
