"""Concat, Stack, Split, Slice, Gather CPU kernels at and below max shape, bounds as inputs."""

from __future__ import annotations

import ctypes

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from op_harness import build_kernel, check_kernel, cpu_device, infer, kernel_peak_bytes, make_node, reference, replay

from engine.devices.cpu import tensor as tensor_kernels
from engine.devices.cpu import threads as T
from engine.ops import get_op
from engine.ops.registry import TensorInfo

RNG = np.random.default_rng(7)


def _x(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("op,axis", [("Concat", 1), ("Concat", -1), ("Concat", 0), ("Stack", 0), ("Stack", -1)])
def test_join_kernels(op, axis):
    a, b = _x(2, 3, 4), _x(2, 3, 4)
    if op == "Concat":  # a different size along the joined axis
        b = np.take(b, [0], axis=axis)
    node = make_node(op, 3, params={"axis": axis})
    check_kernel(node, [a, b, a])
    check_kernel(node, [a[:1].copy(), b[:1].copy(), a[:1].copy()], [a, b, a])


def test_concat_promotes_dtypes_like_torch():
    node = make_node("Concat", 2, params={"axis": 0})
    ins = [np.arange(3, dtype=np.int32), np.arange(2, dtype=np.int64)]
    assert infer(node, ins)[0].dtype == np.int64
    check_kernel(node, ins)


@pytest.mark.parametrize("sizes,n_out", [([1, 5, 0, 2], 4), (None, 3), (None, 4), ([8], 1)])
def test_split_kernel(sizes, n_out):
    x = _x(3, 8, 2)
    node = make_node("Split", 1, n_out, params={"axis": 1, "sizes": sizes})
    check_kernel(node, [x])
    if sizes is None:  # equal chunks follow the actual size
        check_kernel(node, [x[:, :6].copy()], [x])


@pytest.mark.parametrize("params", [
    {"starts": [1], "ends": [2**31 - 1], "axes": [-1], "steps": [2]},
    {"starts": [-1, 0], "ends": [-2**31, 3], "axes": [2, 0], "steps": [-1, 1]},
    {"starts": [5], "ends": [1], "axes": [1], "steps": [-2]},
    {"starts": [10], "ends": [20], "axes": [1], "steps": [1]},
])
def test_slice_kernel(params):
    x = _x(4, 6, 7)
    node = make_node("Slice", 1, params=params)
    check_kernel(node, [x])
    check_kernel(node, [x[:3, :5, :4].copy()], [x])


@pytest.mark.parametrize("axis,idx", [(0, [[3, -1], [0, 2]]), (-1, [-5, 4, 0]), (1, 2), (1, [])])
def test_gather_kernel(axis, idx):
    x = _x(4, 3, 5)
    node = make_node("Gather", 2, params={"axis": axis})
    indices = np.array(idx, np.int64)
    check_kernel(node, [x, indices])
    check_kernel(node, [x[:, :, :4].copy(), indices.astype(np.int32) % 3], [x, indices])


@pytest.mark.parametrize("op,n_in,n_out,params", [
    ("Concat", 2, 1, {"axis": 1}), ("Stack", 2, 1, {"axis": 0}), ("Split", 1, 2, {"axis": 1, "sizes": [8, 8]}),
    ("Slice", 1, 1, {"starts": [1], "ends": [-1], "axes": [3], "steps": [1]}),
])
def test_kernel_allocates_no_temporaries(op, n_in, n_out, params):
    x = _x(4, 16, 32, 32)
    assert kernel_peak_bytes(make_node(op, n_in, n_out, params=params), [x] * n_in) < 16 * 1024


_BOUND = st.one_of(st.integers(-9, 9), st.sampled_from([2**31 - 1, -2**31, 2**63 - 1, -2**63]))


@settings(max_examples=60, deadline=None)
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=6), data=st.data())
def test_slice_property(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    start, end = data.draw(_BOUND), data.draw(_BOUND)
    step = data.draw(st.sampled_from([-3, -2, -1, 1, 2, 3]))
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    node = make_node("Slice", 1, params={"starts": [start], "ends": [end], "axes": [axis], "steps": [step]})
    (info,) = infer(node, [x])
    (y,) = reference(node, [x])
    assert info.shape == y.shape
    # every kept index lies inside the axis, in step order
    dim = shape[axis]
    idx = np.moveaxis(y, axis, 0).reshape(y.shape[axis], -1)[:, 0] if y.size else np.array([])
    if y.size:
        stride = int(np.prod(shape[axis % len(shape) + 1:]))
        pos = (idx // stride) % dim
        assert np.all((pos >= 0) & (pos < dim)) and np.all(np.diff(pos) == step)
    check_kernel(node, [x])


# -- Slice with bounds given as inputs (run-time bounds computed from shapes) ------------------------------------
def _infos(arrays):
    """Bound inputs are host values: known to infer, as the runtime computes them per input signature."""
    return [TensorInfo(a.shape, a.dtype, None if i == 0 else a) for i, a in enumerate(arrays)]


def _bounds(x, half_axis):
    """Like `x[:, 1:x.size(1) // 2]` with a step: starts, ends, steps as int64 host arrays."""
    return [np.array([1], np.int64), np.array([x.shape[half_axis] // 2], np.int64), np.array([1], np.int64)]


@pytest.mark.parametrize("n_bounds", [2, 3])
def test_slice_bounds_as_inputs_follow_the_actual_shape(n_bounds):
    big, small = _x(2, 10, 3), _x(2, 6, 3)
    node = make_node("Slice", 1 + n_bounds, params={"starts": [0], "ends": [0], "axes": [1], "steps": [2]})
    op = get_op("Slice")
    kernel = build_kernel(node, _infos([big, *_bounds(big, 1)[:n_bounds]]))[0]  # built once, at the max shapes
    for x in (big, small):
        ins = [x, *_bounds(x, 1)[:n_bounds]]
        want = x[:, 1:x.shape[1] // 2:(1 if n_bounds == 3 else 2)]
        (info,) = op.infer(node, _infos(ins))
        assert info.shape == want.shape
        np.testing.assert_array_equal(reference(node, ins)[0], want)
        out = np.full(info.shape, np.nan, np.float32)
        kernel(ins, [out], np.zeros(0, np.uint8))
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("shape,axis", [((2, 116, 7, 5), 1), ((0, 6, 3), 1), ((4,), 0), ((3, 5, 0), -1),
                                        ((2, 3, 4), 2)])
def test_split_then_concat_round_trip_edge_shapes(shape, axis):
    """The column-range plans (one per input shape) on batch > 1, empty tensors, 1-D and last-axis cuts."""
    x = _x(*shape)
    n = shape[axis]
    sizes = [n // 2, n - n // 2]
    split = make_node("Split", 1, 2, params={"axis": axis, "sizes": sizes})
    check_kernel(split, [x], rtol=0, atol=0)
    pieces = reference(split, [x])
    check_kernel(make_node("Concat", 2, params={"axis": axis}), pieces, rtol=0, atol=0)
    check_kernel(make_node("Stack", 2, params={"axis": axis}), [pieces[0], pieces[0]], rtol=0, atol=0)


@pytest.mark.parametrize("shape,groups,dtype", [((1, 116, 7, 7), 2, np.float32), ((3, 9, 4, 5), 3, np.float32),
                                                ((2, 6, 3, 3), 6, np.float64), ((2, 5, 1, 2), 1, np.int64),
                                                ((2, 4, 3, 3), 2, np.float16), ((0, 4, 2, 2), 2, np.float32)])
def test_channel_shuffle_row_kernel(shape, groups, dtype):
    x = (RNG.standard_normal(shape) * 10).astype(dtype)
    node = make_node("ChannelShuffle", 1, params={"groups": groups})
    check_kernel(node, [x], rtol=0, atol=0)
    if shape[0] > 1:  # built for the batch, run on one image
        check_kernel(node, [x[:1].copy()], [x], rtol=0, atol=0)


def test_embedding_gather_reads_only_the_rows_it_picks():
    """An embedding table is a read-only weight: the lookup copies the picked rows, never the table (numpy's take
    copies an operand that is not aligned and contiguous)."""
    from op_harness import build_kernel, kernel_peak_bytes

    from engine.ops.registry import TensorInfo

    table = np.random.default_rng(0).standard_normal((20000, 96)).astype(np.float32)
    table.flags.writeable = False
    ids = np.array([[3, -1, 19999, 0, 7]], np.int64)
    node = make_node("Gather", 2, params={"axis": 0})
    fn, ws = build_kernel(node, [TensorInfo(table.shape, table.dtype, table), TensorInfo(ids.shape, ids.dtype)])
    out = np.empty((1, 5, 96), np.float32)
    fn([table, ids], [out], ws)
    np.testing.assert_array_equal(out, table[ids % 20000])
    assert kernel_peak_bytes(node, [table, ids]) < table.nbytes // 100


@pytest.mark.parametrize("count", [2, 3])
def test_a_large_concat_copies_every_byte_once_over_the_team(count, monkeypatch):
    """The team's byte shares of a join's copies (loops.rows.copies_team) cut inside copies and between them, at
    any team size: rows of odd lengths land where np.concatenate puts them, in the Python path and as one call
    outside a region (a program's record where the run would not split)."""
    cpu_device()
    if T.pool_kind(T.get_policy(), T._openmp is not None) != "openmp":
        pytest.skip("our kernels do not run on OpenMP's team here (no oneDNN or the `short` policy)")
    monkeypatch.setattr(tensor_kernels, "native_regions", lambda: True)
    monkeypatch.setattr(tensor_kernels, "JOIN_TEAM_BYTES", 0)
    ran = []
    native = tensor_kernels.run_native
    monkeypatch.setattr(tensor_kernels, "run_native", lambda fn, data: ran.append(fn) or native(fn, data))
    before = T.get_threads()
    T.set_threads(count)
    try:
        for shapes, axis in [([(3, 5, 7), (3, 1, 7), (3, 11, 7)], 1), ([(1, 333), (1, 17)], 1), ([(2, 4), (5, 4)], 0)]:
            xs = [_x(*s) for s in shapes]
            node = make_node("Concat", len(xs), params={"axis": axis})
            kernel, workspace = build_kernel(node, [TensorInfo(x.shape, x.dtype) for x in xs])
            want = np.concatenate(xs, axis=axis)
            out = np.full_like(want, np.nan)
            kernel(xs, [out], workspace)
            np.testing.assert_array_equal(out, want)
    finally:
        T.set_threads(before)
    assert ran and set(ran) == {tensor_kernels.copies_team().address}
    copies = tensor_kernels._join_copies(xs, np.zeros_like(want), 1, [(0, 8), (8, 28)])
    out = np.zeros(28, np.float32)
    copies[:, 0] += out.ctypes.data - copies[0, 0]  # into `out`: the first copy's row starts it
    job = tensor_kernels._copies_job(copies)  # held through the call
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(tensor_kernels.copies_team().address)(job.ctypes.data)  # one thread
    np.testing.assert_array_equal(out, np.concatenate([x.reshape(-1) for x in xs]))


@pytest.mark.parametrize("op", ["Split", "Concat"])
@pytest.mark.parametrize("shape,axis", [((1, 128, 48), 2), ((2, 3, 9), 1), ((40, 6), 1), ((3, 8, 5, 4), 3)])
def test_splits_and_joins_replay_as_they_ran(op, shape, axis):
    """A Split's copies and a Concat's as native_program records (one memmove a row for a few rows, else one call of
    copies_team over the list on this thread): the outputs numpy's copies gave, every byte and no other."""
    cpu_device()
    x = _x(*shape)
    parts = [shape[axis] // 3, shape[axis] - shape[axis] // 3 - 1, 1]
    if op == "Split":
        node = make_node("Split", 1, 3, params={"axis": axis, "sizes": parts})
        ins = [x]
        want = np.split(x, np.cumsum(parts)[:-1], axis=axis)
    else:
        ins = np.split(x, np.cumsum(parts)[:-1], axis=axis)
        ins = [np.ascontiguousarray(p) for p in ins]
        node = make_node("Concat", 3, params={"axis": axis})
        want = [x]
    kernel, workspace = build_kernel(node, [TensorInfo(a.shape, a.dtype) for a in ins])
    ran = [np.full(w.shape, np.nan, np.float32) for w in want]
    kernel(ins, ran, workspace)
    for r, w in zip(ran, want, strict=True):
        np.testing.assert_array_equal(r, w)
    got = [np.full(w.shape, np.nan, np.float32) for w in want]
    native = kernel.native(ins, got, workspace)
    assert native is not None and replay(native) is None
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
