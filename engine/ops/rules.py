"""Rules the op families share: numpy broadcasting, axis normalisation, torch's dtype promotion, int params and
the propagation of values known before running."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import TensorInfo

F32 = np.dtype(np.float32)
BOOL = np.dtype(np.bool_)
INT64 = np.dtype(np.int64)
# Values known before running are computed on the host only this small (shape arithmetic, index lists): a size
# read from a file (a Full or Expand to a huge shape) must never be allocated at load.
HOST_EVAL_MAX_ELEMENTS = 4096


def broadcast(node: Node, shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """numpy broadcasting of `shapes`; ShapeError naming the node when they do not fit."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"{node.where()}: {node.op_type} cannot broadcast shapes "
                         f"{', '.join(str(tuple(s)) for s in shapes)}") from None


def norm_axis(node: Node, axis: int, rank: int) -> int:
    """A non-negative axis in [0, rank); ShapeError when out of range."""
    r = max(rank, 1)  # torch lets a 0-d tensor use axis 0 / -1
    if not -r <= axis < r:
        raise ShapeError(f"{node.where()}: {node.op_type} axis {axis} out of range for rank {rank}")
    return axis % r if rank else 0


def norm_axes(node: Node, axes: Sequence[int] | None, rank: int) -> tuple[int, ...]:
    """Sorted distinct non-negative axes; None or [] means every axis (torch and ONNX reductions)."""
    if axes is None or (not isinstance(axes, int) and len(axes) == 0):
        return tuple(range(rank))
    if isinstance(axes, int):
        axes = [axes]
    out = sorted({norm_axis(node, int(a), rank) for a in axes})
    return tuple(out)


def _category(dt: np.dtype) -> int:
    if dt == BOOL:
        return 0
    if np.issubdtype(dt, np.integer):
        return 1
    return 2


def promote(infos: Sequence[TensorInfo]) -> np.dtype:
    """torch's type promotion: the highest category wins, 0-d operands only count when they raise the category.

    So float32 tensor + int64 scalar stays float32 (numpy would say float64)."""
    dims = [np.dtype(i.dtype) for i in infos if len(i.shape) > 0]
    zero = [np.dtype(i.dtype) for i in infos if len(i.shape) == 0]
    result = _widest(dims) if dims else _widest(zero)
    if dims and zero:
        top = max(_category(d) for d in zero)
        if top > _category(result):
            result = _widest([d for d in zero if _category(d) == top])
    return result


def _widest(dtypes: Sequence[np.dtype]) -> np.dtype:
    top = max(_category(d) for d in dtypes)
    return np.dtype(np.result_type(*[d for d in dtypes if _category(d) == top]))


def float_of(dt: np.dtype) -> np.dtype:
    """The dtype a float-valued op returns for input `dt` (ints and bools become float32, as torch does)."""
    dt = np.dtype(dt)
    return dt if np.issubdtype(dt, np.floating) else F32


def all_values(ins: Sequence[TensorInfo]) -> bool:
    return bool(ins) and all(i.value is not None for i in ins)


def with_value(node: Node, ins: Sequence[TensorInfo], outs: list[TensorInfo],
               reference: Callable[[Node, list[np.ndarray]], list[np.ndarray]]) -> list[TensorInfo]:
    """Fills `value` in on `outs` by running `reference` when every input is known (shape arithmetic)."""
    if not all_values(ins) or sum(elements(o.shape) for o in outs) > HOST_EVAL_MAX_ELEMENTS:
        return outs
    vals = reference(node, [np.asarray(i.value) for i in ins])
    return [TensorInfo(o.shape, o.dtype, np.asarray(v, dtype=o.dtype).reshape(o.shape))
            for o, v in zip(outs, vals, strict=True)]


def elements(shape: Sequence[int]) -> int:
    """The element count of `shape`, in Python ints: a product of huge dims from a file must not wrap around."""
    return math.prod(int(d) for d in shape)


def ints(node: Node, what: str, value) -> list[int]:
    """A host int list from a param or a known value; ShapeError when it is not one."""
    try:
        arr = np.asarray(value)
        if arr.dtype.kind not in "iub":
            raise TypeError
        return [int(v) for v in arr.reshape(-1)]
    except (TypeError, ValueError):
        raise ShapeError(f"{node.where()}: {node.op_type} {what} must be a list of ints, got {value!r}") from None
