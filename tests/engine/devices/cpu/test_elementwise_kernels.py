"""Elementwise CPU kernels vs the references: broadcasting, mixed dtypes, in place, the numba row kernel and
its plans, threads, no temporaries."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from op_harness import (
    build_kernel,
    check_kernel,
    cpu_device,
    force_native_regions,
    infer,
    infos_of,
    kernel_peak_bytes,
    make_node,
    replay,
)

from engine.devices.cpu import elementwise as cpu_elementwise
from engine.devices.cpu import native_program as N
from engine.devices.cpu import threads as T
from engine.errors import ShapeError
from engine.ops import elementwise

RNG = np.random.default_rng(2)
# inputs in each unary's domain
DOMAIN = {"Log": "pos", "Log10": "pos", "Log1p": "pos", "Sqrt": "pos", "Rsqrt": "pos", "Reciprocal": "pos",
          "Asin": "unit", "Acos": "unit", "Atanh": "unit", "Tan": "unit", "Acosh": "above1", "Not": "bool"}


def _unary_input(op: str, shape) -> np.ndarray:
    x = (RNG.standard_normal(shape) * 2).astype(np.float32)
    kind = DOMAIN.get(op)
    if kind == "pos":
        return np.abs(x) + 0.1
    if kind == "unit":
        return np.tanh(x) * 0.95
    if kind == "above1":
        return np.abs(x) + 1.1
    return x > 0 if kind == "bool" else x


@pytest.mark.parametrize("op", sorted(elementwise.BINARY))
@pytest.mark.parametrize("shapes", [((2, 3, 5), (3, 1)), ((7,), ()), ((1, 4), (3, 1)), ((2, 3, 5), (2, 3, 5))])
def test_binary_kernel_matches_reference(op, shapes):
    a = (RNG.standard_normal(shapes[0]) * 3).astype(np.float32)
    b = (RNG.standard_normal(shapes[1]) * 3 + 0.5).astype(np.float32)
    if op == "Pow":
        a = np.abs(a) + 0.1
    if op in ("And", "Or", "Xor"):
        a, b = a > 0, b > 0
    node = make_node(op, 2)
    check_kernel(node, [a, b])
    if np.broadcast_shapes(a.shape, b.shape) == a.shape:
        check_kernel(node, [a, b], inplace=True)


@pytest.mark.parametrize("op", ["Add", "Mul", "Div", "FloorDiv", "Mod", "Less", "Xor"])
def test_binary_kernel_mixed_dtypes(op):
    ints = RNG.integers(-9, 10, (4, 5)).astype(np.int32)
    node = make_node(op, 2)
    check_kernel(node, [ints, np.array(3, np.int64)])
    if op != "Xor":
        check_kernel(node, [RNG.standard_normal((4, 5)).astype(np.float32), np.array(2, np.int64)])
        check_kernel(node, [ints, np.array(2.5, np.float32)])


@pytest.mark.parametrize("op", sorted(elementwise.BINARY))
def test_binary_kernel_below_max_shape(op):
    node = make_node(op, 2)
    big = [np.ones((4, 8, 8), np.float32), np.ones((8, 1), np.float32)]
    small = [np.abs(RNG.standard_normal((2, 3, 5))).astype(np.float32) + 0.1,
             RNG.standard_normal((3, 1)).astype(np.float32) + 2]
    if op in ("And", "Or", "Xor"):
        big, small = [b > 0 for b in big], [s > 1 for s in small]
    check_kernel(node, small, big)
    check_kernel(node, small, big, inplace=True)


@pytest.mark.parametrize("op", sorted(elementwise.UNARY))
def test_unary_kernel_below_max_shape(op):
    check_kernel(make_node(op, 1), [_unary_input(op, (2, 3))], [_unary_input(op, (5, 4))])


def test_where_kernel_broadcasts():
    node = make_node("Where", 3)
    cond = RNG.random((3, 1)) > 0.5
    check_kernel(node, [cond, RNG.standard_normal((2, 3, 4)).astype(np.float32), np.array(0.0, np.float32)])
    check_kernel(node, [cond, np.arange(4, dtype=np.int64), np.array(-1, np.int64)])
    with pytest.raises(ShapeError, match="condition must be bool"):  # a number is never read as a truth value
        check_kernel(node, [cond.astype(np.int64), np.arange(4, dtype=np.int64), np.array(-1, np.int64)])
    big = [np.ones((4, 1), bool), np.ones((3, 4, 6), np.float32), np.ones((), np.float32)]
    check_kernel(node, [cond, RNG.standard_normal((2, 3, 4)).astype(np.float32), np.array(0.0, np.float32)], big)


@pytest.mark.parametrize("op", sorted(elementwise.UNARY))
@pytest.mark.parametrize("shape", [(3, 5, 7), (1,), ()])
def test_unary_kernel_matches_reference(op, shape):
    x = _unary_input(op, shape)
    node = make_node(op, 1)
    check_kernel(node, [x])
    if x.dtype == np.float32:
        check_kernel(node, [x], inplace=True)


@pytest.mark.parametrize("op", ["Exp", "Sqrt", "Abs", "Round", "Floor", "Erf", "Neg"])
def test_unary_kernel_on_integers(op):
    x = np.arange(0, 9, dtype=np.int64).reshape(3, 3)
    check_kernel(make_node(op, 1), [x])
    check_kernel(make_node(op, 1), [x[:2]], [x])


@pytest.mark.parametrize("op,other", [("Add", (16, 1, 1)), ("Mul", ()), ("Sub", (4, 16, 32, 32)), ("Div", (32,)),
                                      ("Less", (1,)), ("Maximum", ())])
def test_binary_kernel_allocates_no_temporaries(op, other):
    x = RNG.standard_normal((4, 16, 32, 32)).astype(np.float32)  # 256 KiB
    y = RNG.standard_normal(other).astype(np.float32)
    assert kernel_peak_bytes(make_node(op, 2), [x, y]) < 64 * 1024
    assert kernel_peak_bytes(make_node(op, 2), [x, np.array(2, np.int64)]) < 64 * 1024


@pytest.mark.parametrize("op", ["Exp", "Sqrt", "Erf", "Rsqrt", "Abs"])
def test_unary_kernel_allocates_no_temporaries(op):
    x = np.abs(RNG.standard_normal((4, 16, 32, 32))).astype(np.float32)
    assert kernel_peak_bytes(make_node(op, 1), [x]) < 16 * 1024


@settings(max_examples=40, deadline=None)
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4),
       op=st.sampled_from(["Add", "Sub", "Mul", "Div", "Maximum", "Mod", "GreaterEqual"]))
def test_binary_broadcasting_property(shapes, op):
    a = RNG.standard_normal(shapes.input_shapes[0]).astype(np.float32)
    b = (RNG.standard_normal(shapes.input_shapes[1]) + 3).astype(np.float32)
    node = make_node(op, 2)
    (info,) = infer(node, [a, b])
    assert info.shape == shapes.result_shape
    check_kernel(node, [a, b])


def test_erf_float16_runs_through_the_reference_path():
    check_kernel(make_node("Erf", 1), [np.linspace(-3, 3, 13).astype(np.float16)], rtol=1e-3, atol=1e-3)


# -- row-broadcast kernel (engine/devices/cpu/loops/rows.rows_binary) ----------------------------------------------
@pytest.mark.parametrize("big,small,plan", [
    ((2, 5, 7, 9), (2, 5, 1, 1), (10, 10, 1)),               # SE excitation, NCHW
    ((2, 5, 7, 9), (5, 1, 1), (10, 5, 1)),                   # per-channel, batch broadcast
    ((1, 3, 6, 6, 16), (1, 3, 1, 1, 16), (3, 3, 16)),        # the same in the blocked layout
    ((2, 3, 4, 5), (2, 1, 1, 1), (2, 2, 1)),                 # per-image scale
    ((2, 5, 7, 9), (2, 5, 7, 9), None),                      # no broadcast: numpy
    ((2, 5, 7, 9), (1, 1, 1, 9), None),                      # broadcast last: numpy
    ((2, 5, 2, 1), (2, 5, 1, 1), None),                      # a middle run shorter than 4: numpy
    ((2, 5, 7, 9), (2, 1, 7, 1), None),                      # two broadcast runs: numpy
])
def test_row_plan(big, small, plan):
    assert cpu_elementwise.row_plan(big, small) == plan


ROW_CASES = [((2, 5, 7, 9), (2, 5, 1, 1)), ((3, 5, 4, 4), (5, 1, 1)), ((1, 3, 6, 6, 16), (1, 3, 1, 1, 16)),
             ((2, 2, 3, 20, 16), (2, 2, 1, 1, 16)), ((2, 3, 4, 5), (2, 1, 1, 1)), ((1, 7, 30, 30), (1, 7, 1, 1))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("big,small", ROW_CASES)
def test_row_broadcast_kernel_both_orders_and_in_place(op, big, small):
    x = RNG.standard_normal(big).astype(np.float32)
    s = (RNG.standard_normal(small) + 3).astype(np.float32)
    node = make_node(op, 2)
    check_kernel(node, [x, s], rtol=1e-6, atol=0)
    check_kernel(node, [x, s], rtol=1e-6, atol=0, inplace=True)  # output 0 in x's buffer
    check_kernel(node, [s, x + 3], rtol=1e-6, atol=0)            # small operand first (torch's `scale * x`)
    check_kernel(node, [x.astype(np.float64), s.astype(np.float64)], rtol=1e-12, atol=0, inplace=True)


def test_row_broadcast_kernel_specials_and_smaller_batch():
    x = RNG.standard_normal((2, 4, 5, 5)).astype(np.float32)
    x[0, 1, 2, 3], x[1, 2, 0, 0] = np.nan, np.inf
    s = np.array([0.0, -0.0, np.inf, np.nan, 1, 2, -1, 0.5], np.float32).reshape(2, 4, 1, 1)
    for op in ("Mul", "Div", "Add", "Sub"):
        check_kernel(make_node(op, 2), [x, s], rtol=0, atol=0)
        check_kernel(make_node(op, 2), [s, x], rtol=0, atol=0)
    check_kernel(make_node("Mul", 2), [x[:1], s[:1]], [np.zeros((4, 4, 5, 5), np.float32), s[:1].repeat(4, 0)])


def test_row_broadcast_kernel_split_over_threads(monkeypatch):
    from engine.devices.cpu import threads as _threads
    before = _threads.get_threads()
    monkeypatch.setattr(_threads, "MIN_WORK", 0)
    _threads.set_threads(3)
    try:
        x = RNG.standard_normal((1, 7, 6, 6, 16)).astype(np.float32)
        check_kernel(make_node("Mul", 2), [x, RNG.standard_normal((1, 7, 1, 1, 16)).astype(np.float32)])
    finally:
        _threads.set_threads(before)


@pytest.mark.parametrize("split", [False, True], ids=["one-call", "region"])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("big,small", [*ROW_CASES, ((2, 3, 5, 7), (2, 3, 5, 7)), ((1, 2, 9, 9, 16), (1, 2, 9, 9, 16)),
                                       ((37,), (37,))])
def test_float32_binaries_replay_as_they_ran(op, big, small, split, monkeypatch, request):
    """Add/Sub/Mul/Div of float32 as a native program's record (loops/rows.binary_team): the broadcast rows and
    the same-shape op (numpy in the Python path), on this thread or as a region over 2-3 threads whose shares start
    mid-row, in place or not, with NaN, infinities, signed zeros and a zero divisor: bit for bit what the kernel's
    Python wrote."""
    if split:
        force_native_regions(monkeypatch, request, 3 if len(big) % 2 else 2)
    else:
        cpu_device()
    x = RNG.standard_normal(big).astype(np.float32)
    s = (RNG.standard_normal(small) + 3).astype(np.float32)
    x.reshape(-1)[:4] = [np.nan, np.inf, -0.0, 0.0]
    s.reshape(-1)[:2] = [0.0, -np.inf]
    node = make_node(op, 2)
    for a, b in ((x, s), (s, x)) if small != big else ((x, s),):
        fn, ws = build_kernel(node, infos_of([a, b], node=node))
        want = np.full(np.broadcast_shapes(a.shape, b.shape), 7, np.float32)
        with np.errstate(all="ignore"):
            fn([a, b], [want], ws)
            np.testing.assert_array_equal(want, getattr(np, {"Add": "add", "Sub": "subtract", "Mul": "multiply",
                                                              "Div": "divide"}[op])(a, b))
        got = np.full_like(want, 7)
        native = fn.native([a, b], [got], ws)
        assert (N.OP_REGION in {r[0] for r in native.records}) == split
        assert replay(native) is None
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # signed zeros, NaN payloads
        if a.shape == want.shape:  # in place: the output in a's buffer
            inplace = a.copy()
            assert replay(fn.native([inplace, b], [inplace], ws)) is None
            np.testing.assert_array_equal(inplace.view(np.uint32), want.view(np.uint32))


def test_float64_and_mismatched_binaries_have_no_records():
    node = make_node("Add", 2)
    x64 = RNG.standard_normal((2, 3)).astype(np.float64)
    fn, ws = build_kernel(node, infos_of([x64, x64], node=node))
    assert getattr(fn, "native", None) is None
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    fn, ws = build_kernel(node, infos_of([x, x[:, :1, :1]], node=node))
    assert fn.native([x, x[:, :1, :1].copy()], [np.empty_like(x)], ws) is not None
    assert fn.native([x, x[:1, :1, :]], [np.empty_like(x)], ws) is None  # a non-contiguous operand


def test_a_same_shape_binary_is_one_call_where_a_split_would_not_run_natively(monkeypatch, request):
    """numpy's same-shape op in the Python path runs on one thread whatever the size: where a split would go over
    Python callbacks (the team not running native regions), the record is the loop on this thread, not none."""
    cpu_device()
    before = T.get_threads()
    request.addfinalizer(lambda: T.set_threads(before))
    T.set_threads(2)
    monkeypatch.setattr(T, "MIN_WORK", 0)
    monkeypatch.setattr(T, "native_regions", lambda: False)
    x = RNG.standard_normal((4, 300)).astype(np.float32)
    node = make_node("Mul", 2)
    fn, ws = build_kernel(node, infos_of([x, x], node=node))
    y, got = x + 1, np.empty_like(x)  # the records point into them: alive through the replay
    native = fn.native([x, y], [got], ws)
    assert [r[0] for r in native.records] == [N.OP_CALL]
    assert replay(native) is None
    np.testing.assert_array_equal(got, x * y)
    assert fn.native([x, x[:1]], [got], ws) is None  # the broadcast rows would split from Python: none
