"""CPU kernels of Concat, Stack, Split, Slice, Gather and Index (engine/ops/tensor.py): copies of slices into or out
of the output views; Gather (an embedding lookup) copies only the rows it picks, straight from the weight table
(numba, loops/rows.py); and ChannelShuffle's (engine/ops/resize.py) numba row copy."""

from __future__ import annotations

import math

import numpy as np

from engine.devices.cpu import native_program as N
from engine.devices.cpu.fused_calls import Native
from engine.devices.cpu.kernel import Backends, CpuKernel, empty, numba_ok, reference_fallback, remember
from engine.devices.cpu.loops.rows import CP_COUNT, CP_LEN, CP_LIST, CP_TOTAL, copies_team, gather_rows, shuffle_rows
from engine.devices.cpu.threads import (
    get_threads,
    native_regions,
    parallel_for,
    region_job,
    region_record,
    run_native,
)
from engine.ir import Node
from engine.ops.registry import TensorInfo
from engine.ops.resize import channel_reference
from engine.ops.rules import norm_axis
from engine.ops.tensor import check_indices, index_dims, index_tuple, slice_bounds, slice_index, split_sizes


def _cuts(shape: tuple[int, ...], axis: int, widths: list[int]) -> tuple[int, int, list[tuple[int, int]]]:
    """The (outer, inner) factors of `shape` around `axis` and each piece's [start, end) of the flattened
    (outer, dim * inner) rows: a piece of a Concat/Split along `axis` is a column range of that 2-D view."""
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    bounds = np.concatenate([[0], np.cumsum(widths)]) * inner
    return outer, inner, [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

def _join_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
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
            plan = remember(plans, key, (outer, cols))
        outer, cols = plan
        if out.size == 0:
            return
        if _team_joins(inputs, out, outer):
            copies = _join_copies(inputs, out, outer, cols)
            if run_native(copies_team().address, _copies_job(copies)):
                return
        rows = out.reshape(outer, -1)
        for x, (a, b) in zip(inputs, cols, strict=True):
            np.copyto(rows[:, a:b], x.reshape(outer, b - a), casting="unsafe")

    def native(inputs, outputs, workspace):
        plan = plans.get(tuple(x.shape for x in inputs))
        return None if plan is None else _join_records(inputs, outputs[0], *plan)

    copies_team()  # compiled (or loaded) now, not in a request
    run.native = native  # type: ignore[attr-defined]
    return run


# Output bytes from which a join's copies split over OpenMP's team as one native region (loops.rows.copies_team),
# as the layout's lane copies do from a million bytes (layout/kernels.NATIVE_COPY_FLOATS): one core's copy is bound
# by its own bandwidth (12 MB: 0.89 ms on one thread, 0.56 on two, 2 vCPUs), smaller ones by reading what the
# other core just wrote. SqueezeNet's fire concats at batch 8 (6-12 MB each): 3.6 ms a run on one thread.
JOIN_TEAM_BYTES = 1 << 20
JOIN_TEAM_ROWS = 64  # a concat along a later axis, of more rows than this, stays numpy's copy


def _team_joins(inputs, out: np.ndarray, outer: int) -> bool:
    """Whether a join's copies run as one native region: large, in few rows (`outer`: each input's copies are
    listed per call), on a team that runs native regions, every array contiguous and of the output's dtype (plain
    byte copies)."""
    if out.nbytes < JOIN_TEAM_BYTES or get_threads() < 2 or not native_regions() or not out.flags.c_contiguous:
        return False
    if outer > JOIN_TEAM_ROWS:
        return False
    return all(x.dtype == out.dtype and x.flags.c_contiguous for x in inputs)


def _join_copies(inputs, out: np.ndarray, outer: int, cols: list[tuple[int, int]]) -> np.ndarray:
    """The join's byte copies as copies_team's (dst, src, bytes) rows: one per row of each input."""
    size, width = out.itemsize, out.size // outer
    return np.array([(out.ctypes.data + (r * width + a) * size, x.ctypes.data + r * (b - a) * size, (b - a) * size)
                     for x, (a, b) in zip(inputs, cols, strict=True) for r in range(outer) if b > a],
                    np.int64).reshape(-1, 3)


def _copies_job(copies: np.ndarray) -> np.ndarray:
    job = region_job(CP_LEN)
    job[CP_COUNT], job[CP_LIST], job[CP_TOTAL] = copies.shape[0], copies.ctypes.data, int(copies[:, 2].sum())
    return job


# A join whose pieces are more rows than this (a concat along a late axis) stays a Python copy: as records it would
# be one memmove per row of each input
JOIN_RECORD_ROWS = 16


def _join_records(inputs, out: np.ndarray, outer: int, cols: list[tuple[int, int]]) -> Native | None:
    """The join's copies as native_program records (fused_calls.py), where every input has the output's dtype (no
    cast) and all are contiguous: _copies_records'."""
    if not out.flags.c_contiguous or out.size == 0:
        return None
    if any(x.dtype != out.dtype or not x.flags.c_contiguous for x in inputs):
        return None
    copies = _join_copies(inputs, out, outer, cols)
    if _team_joins(inputs, out, outer):
        job = _copies_job(copies)
        record = region_record(copies_team().address, job.ctypes.data)
        if record is not None:
            return Native([record], keep=[copies, job])
    return _copies_records(copies)


def _copies_records(copies: np.ndarray) -> Native:
    """A join's or a split's (dst, src, bytes) copies as records: one memmove each for a few
    (JOIN_RECORD_ROWS), else one call of copies_team on this thread over the list (a split along a late axis: BERT's
    query, key and value, 128 rows each), as numpy's copies in the Python path run on this thread."""
    if len(copies) <= JOIN_RECORD_ROWS:
        return Native([N.copy_record(int(dst), int(src), int(size)) for dst, src, size in copies])
    job = _copies_job(copies)
    return Native([(N.OP_CALL, copies_team().address, job.ctypes.data)], keep=[copies, job])

def _split_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    plans: dict[tuple, tuple] = {}

    def run(inputs, outputs, workspace):
        x = inputs[0]
        plan = plans.get(x.shape)
        if plan is None:
            axis, sizes = split_sizes(node, x.shape)
            outer, _, cols = _cuts(x.shape, axis, sizes)
            plan = remember(plans, x.shape, (outer, cols))
        outer, cols = plan
        if x.size == 0:
            return
        rows = x.reshape(outer, -1)
        for out, (a, b) in zip(outputs, cols, strict=True):
            np.copyto(out.reshape(outer, b - a), rows[:, a:b])

    def native(inputs, outputs, workspace):
        x = inputs[0]
        plan = plans.get(x.shape)
        if plan is None or x.size == 0 or not x.flags.c_contiguous:
            return None
        if any(out.dtype != x.dtype or not out.flags.c_contiguous for out in outputs):
            return None
        outer, cols = plan
        size, width = x.itemsize, x.size // outer
        copies = np.array([(out.ctypes.data + r * (b - a) * size, x.ctypes.data + (r * width + a) * size,
                            (b - a) * size) for out, (a, b) in zip(outputs, cols, strict=True)
                           for r in range(outer) if b > a], np.int64).reshape(-1, 3)
        return _copies_records(copies)

    copies_team()  # compiled (or loaded) now, not in a request
    run.native = native  # type: ignore[attr-defined]
    return run

def channel_shuffle_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    """A numba row copy per output channel of the (N*C, H*W) view (the op's infer checked groups divides C)."""
    groups = int(node.params["groups"])
    if not numba_ok(ins[0].dtype):
        return reference_fallback(node, channel_reference)
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

def _slice_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    # Bound inputs arrive as the host values of the current input signature, so they are read per call.
    def run(inputs, outputs, workspace):
        x = inputs[0]
        np.copyto(outputs[0], x[slice_index(node, x.shape, slice_bounds(node, inputs[1:]))])
    return run

def _gather_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    dt, it = np.dtype(ins[0].dtype), np.dtype(ins[1].dtype)
    if not (numba_ok(dt) and it.kind in "iu" and ins[0].shape):
        def run_take(inputs, outputs, workspace):
            data, idx = inputs
            axis = norm_axis(node, int(node.params.get("axis", 0)), data.ndim)
            check_indices(node, idx, data.shape[axis])
            # in range, so mode="wrap" only maps negatives python-style, unbuffered, into `out`
            np.take(data, idx, axis=axis, out=outputs[0], mode="wrap")
        return run_take
    # compile at build, for the table itself when it is a weight (read-only: a type of its own to numba)
    table = empty(3, dt) if ins[0].value is None else np.asarray(ins[0].value).reshape(1, 1, -1)
    gather_rows(table, empty(1, it), empty(3, dt), 0, 0)

    def run(inputs, outputs, workspace):
        data, idx = inputs
        axis = norm_axis(node, int(node.params.get("axis", 0)), data.ndim)
        dim = data.shape[axis]
        check_indices(node, idx, dim)
        outer, inner = math.prod(data.shape[:axis]), math.prod(data.shape[axis + 1:])
        flat = np.ascontiguousarray(idx).reshape(-1)
        items = outer * flat.size
        if items == 0 or inner == 0:
            return
        parallel_for(gather_rows, items, items * inner, np.ascontiguousarray(data).reshape(outer, dim, inner), flat,
                     outputs[0].reshape(outer, flat.size, inner))
    return run

def _index_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    """x[..., idx0, ..., idxk-1] as one np.take into the output: the checked indices folded into one linear index
    over the indexed dims, taken on axis 1 of x viewed as (before, indexed dims, after). Indexed dims apart are
    moved to the front first (numpy's and torch's rule puts the indices' shape first then)."""
    k = len(ins) - 1
    dims = index_dims(node, len(ins[0].shape), k)
    adjacent = dims == list(range(dims[0], dims[0] + k))

    def run(inputs, outputs, workspace):
        x = inputs[0]
        index = [index_tuple(node, x.shape, inputs[1:])[d] for d in dims]  # checked; negatives still negative
        if not adjacent:
            x = np.moveaxis(x, dims, range(k))
        axis = dims[0] if adjacent else 0
        x = np.ascontiguousarray(x)
        linear = np.asarray(np.ravel_multi_index(np.broadcast_arrays(*index), x.shape[axis:axis + k], mode="wrap"))
        pre, rest = math.prod(x.shape[:axis]), math.prod(x.shape[axis + k:])
        rows = x.reshape(pre, math.prod(x.shape[axis:axis + k]), rest)
        np.take(rows, linear.reshape(-1), axis=1, out=outputs[0].reshape(pre, linear.size, rest))
    return run


KERNELS = {
    "Concat": CpuKernel(_join_kernel), "Stack": CpuKernel(_join_kernel), "Split": CpuKernel(_split_kernel),
    "Slice": CpuKernel(_slice_kernel), "Gather": CpuKernel(_gather_kernel),
    "Index": CpuKernel(_index_kernel),
    "ChannelShuffle": CpuKernel(channel_shuffle_kernel),
}
