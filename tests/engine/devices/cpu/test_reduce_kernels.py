"""Reduction and ArgMax/ArgMin CPU kernels vs the references, no temporaries."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import check_kernel, infer, kernel_peak_bytes, make_node, reference, run_kernel

from engine.ops import reduce

RNG = np.random.default_rng(4)


@pytest.mark.parametrize("op", sorted(reduce.REDUCERS))
@pytest.mark.parametrize("axes,keepdims", [([1, -1], True), ([0], False), (None, True), ([], False), (-2, True)])
def test_kernel_matches_reference(op, axes, keepdims):
    x = (np.abs(RNG.standard_normal((3, 4, 5))) + 0.5).astype(np.float32)
    node = make_node(op, 1, params={"axes": axes, "keepdims": keepdims})
    check_kernel(node, [x])
    check_kernel(node, [x[:2, :3, :1].copy()], [x])


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis,keepdims", [(1, True), (-1, False), (None, False), (None, True)])
def test_arg_kernel_matches_reference(op, axis, keepdims):
    x = RNG.integers(0, 3, (3, 4, 5)).astype(np.float32)  # ties
    node = make_node(op, 1, params={"axis": axis, "keepdims": keepdims})
    check_kernel(node, [x])
    check_kernel(node, [x[:1, :2].copy()], [x])


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_nan_wins_like_torch(op):
    x = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 0.5, 7.0, 1.0]], np.float32)
    node = make_node(op, 1, params={"axis": 1})
    check_kernel(node, [x])
    np.testing.assert_array_equal(run_kernel(node, [x])[0], [1, 2 if op == "ArgMax" else 1])
    check_kernel(make_node(op, 1, params={"axis": 0}), [x])


def test_arg_float16_runs_through_the_reference_path():
    x = RNG.standard_normal((3, 5)).astype(np.float16)
    check_kernel(make_node("ArgMax", 1, params={"axis": 1}), [x])


def test_integer_and_bool_sums():
    ints = RNG.integers(-5, 5, (4, 6)).astype(np.int32)
    node = make_node("ReduceSum", 1, params={"axes": [1]})
    assert infer(node, [ints])[0].dtype == np.int32
    check_kernel(node, [ints])
    assert infer(node, [ints > 0])[0].dtype == np.int64
    check_kernel(node, [ints > 0])
    check_kernel(make_node("ReduceMax", 1, params={"axes": [0]}), [ints])
    assert infer(make_node("ReduceMean", 1, params={"axes": [0]}), [ints])[0].dtype == np.float32


@pytest.mark.parametrize("op,params", [("ReduceMean", {"axes": [2, 3], "keepdims": True}),
                                       ("ReduceMax", {"axes": [1]}), ("ArgMax", {"axis": 1}),
                                       ("ReduceL2", {"axes": [1, 3], "keepdims": True}),
                                       ("ReduceSumSquare", {"axes": None}), ("ReduceLogSum", {"axes": [-1]})])
def test_kernel_allocates_no_temporaries(op, params):
    x = RNG.standard_normal((4, 16, 32, 32)).astype(np.float32)
    assert kernel_peak_bytes(make_node(op, 1, params=params), [x]) < 64 * 1024


@pytest.mark.parametrize("op,axes,shape", [
    ("ReduceMean", [2, 3], (2, 5, 7, 9)), ("ReduceMean", [-2, -1], (1, 33, 7, 7)),
    ("ReduceSum", [1, 2, 3], (3, 4, 5, 6)), ("ReduceMean", [3], (2, 3, 4, 300)), ("ReduceSum", [2, 3], (2, 3, 1, 1))])
@pytest.mark.parametrize("keepdims", [False, True])
def test_trailing_axes_row_sums_match_reference(op, axes, shape, keepdims):
    """Trailing-axes means and sums take the vectorised row-sum kernel (reassociated: float32 rounding only)."""
    x = RNG.standard_normal(shape).astype(np.float32) + 1
    node = make_node(op, 1, params={"axes": axes, "keepdims": keepdims})
    check_kernel(node, [x], rtol=2e-6, atol=1e-6)
    check_kernel(node, [x.astype(np.float64)], rtol=1e-12, atol=1e-12)
    x[0, 0] = np.nan
    got, want = run_kernel(node, [x])[0], reference(node, [x])[0]
    assert np.isnan(got).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
