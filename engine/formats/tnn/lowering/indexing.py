"""TNN layers that read or write elements by index -> Index (GatherND), IndexPut (ScatterND), ScatterElements
(Scatter, ScatterElements). TNN's loops add no bounds check where ONNX would refuse: a negative or out-of-range
index known at load is refused here, one computed at run time is checked by the op (an error, never memory past
the tensor as in TNN)."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import Ctx
from engine.formats.tnn.lowering.registry import handles
from engine.ir import Value


def _split_last(c: Ctx, idx: Value, k: int) -> list[Value]:
    """An (..., k) index tensor as k tensors of its leading shape, one per indexed dim."""
    known = c.value_of(idx)
    if known is not None:
        known = np.asarray(known)
        return [c.const(np.ascontiguousarray(known[..., j]).astype(np.int64), f"index{j}") for j in range(k)]
    return [c.tmp("Gather", [idx, c.const(np.int64(j), f"dim{j}")], {"axis": -1}) for j in range(k)]


def _index_rank(c: Ctx, idx: Value, rank: int | None, what: str) -> int:
    shape = c.shape(idx)
    if shape is None or not shape or shape[-1] <= 0:
        c.unsupported(f"with {what} of unknown or empty shape {shape}")
    k = shape[-1]
    if rank is not None and k > rank:
        c.fail(f"{what} address {k} dims of a rank-{rank} tensor")
    return k


def _check_known(c: Ctx, idx: Value, dims: tuple[int, ...] | None) -> None:
    """Index values known at load: TNN adds them to the offset unchecked, so each must be in [0, dim)."""
    known = c.value_of(idx)
    if known is None or dims is None:
        return
    known = np.asarray(known)
    for j, d in enumerate(dims[: known.shape[-1]]):
        col = known[..., j]
        if col.size and (col.min() < 0 or col.max() >= d):
            c.fail(f"index on dim {j} out of [0, {d}) (got {int(col.min())}..{int(col.max())}): TNN would read "
                   "or write outside the tensor")


@handles("GatherND")
def lower_gather_nd(c: Ctx) -> None:
    """Param batch_dims. TNN's x86 acc takes batch_dims 0 and indices whose last dim is the data's rank (one
    element per index row): out[i...] = data[indices[i..., 0], ..., indices[i..., r-1]]."""
    if c.i(0, 0) != 0:
        c.unsupported(f"with batch_dims {c.i(0)} (TNN's x86 acc refuses it)")
    if len(c.inputs) != 2:
        c.fail(f"takes (data, indices), got {len(c.inputs)} inputs")
    data, idx = c.inputs
    shape = c.shape(data)
    k = _index_rank(c, idx, None if shape is None else len(shape), "indices")
    if shape is None or k != len(shape):
        c.unsupported(f"with indices addressing {k} dims of a rank-{None if shape is None else len(shape)} "
                      "tensor (TNN's x86 acc gathers single elements only)")
    _check_known(c, idx, shape)
    c.out("Index", [data, *_split_last(c, idx, k)])


@handles("ScatterND")
def lower_scatter_nd(c: Ctx) -> None:
    """(data, updates) with the indices a resource, or (data, indices, updates): output = data with the slices
    data[indices[i..., :]] replaced by updates[i...], in index order (a repeated index: the last write wins)."""
    data, idx, updates = _scatter_operands(c)
    _float_data(c, data)
    shape = c.shape(data)
    k = _index_rank(c, idx, None if shape is None else len(shape), "indices")
    _check_known(c, idx, shape)
    c.out("IndexPut", [data, updates, *_split_last(c, idx, k)])


def _scatter_operands(c: Ctx) -> tuple[Value, Value, Value]:
    """(data, indices, updates): from three inputs, or two with the indices a resource."""
    if len(c.inputs) == 3:
        data, idx, updates = c.inputs
        return data, idx, updates
    if len(c.inputs) == 2 and c.attr("indices", required=False) is not None:
        data, updates = c.inputs
        return data, c.const(c.attr("indices"), "indices"), updates
    c.fail(f"takes (data, updates) with an indices resource, or (data, indices, updates); got {len(c.inputs)} "
           "inputs")


def _float_data(c: Ctx, data: Value) -> None:
    """TNN's scatter accs write float32 data only (ScatterElements reads any data as float32)."""
    info = c.low.info(data)
    if info is not None and np.dtype(info.dtype) != np.dtype(np.float32):
        c.unsupported(f"of {np.dtype(info.dtype)} data (TNN's acc writes float32 only)")


def _scatter(c: Ctx, axis: int, reduction: str, data: Value, idx: Value, updates: Value) -> None:
    _float_data(c, data)
    known = c.value_of(idx)
    shape = c.shape(data)
    if known is not None and shape is not None and -len(shape) <= axis < len(shape):
        dim = shape[axis]
        known = np.asarray(known)
        if known.size and (known.min() < -dim or known.max() >= dim):
            c.fail(f"index out of [{-dim}, {dim}) on axis {axis} (got {int(known.min())}..{int(known.max())})")
    c.out("ScatterElements", [data, idx, updates], {"axis": axis, "reduction": reduction})


@handles("Scatter")
def lower_scatter(c: Ctx) -> None:
    """Param axis; (data, updates) with the indices a resource, or (data, indices, updates). CpuScatterLayerAcc:
    ONNX's Scatter (ScatterElements without reduction), negative indices counting from the end."""
    axis = c.i(0, 0)
    data, idx, updates = _scatter_operands(c)
    _scatter(c, axis, "none", data, idx, updates)


@handles("ScatterElements")
def lower_scatter_elements(c: Ctx) -> None:
    """Params axis, op (0: assign, 1: add); inputs (data, indices, updates). CpuScatterElementsLayerAcc reads
    data_dims[axis] with the axis as written (a negative one reads outside the dims) and adds for any op but 0."""
    axis, op = c.i(0, 0), c.i(1, 0)
    if axis < 0:
        c.unsupported(f"with a negative axis {axis} (TNN's acc does not count it from the end)")
    if op not in (0, 1):
        c.unsupported(f"with op {op} (0 assigns, 1 adds)")
    if len(c.inputs) != 3:
        c.fail(f"takes (data, indices, updates), got {len(c.inputs)} inputs")
    _scatter(c, axis, ("none", "add")[op], *c.inputs)
