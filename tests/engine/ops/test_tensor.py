"""Concat, Stack, Split, Slice, Gather: goldens, value propagation, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_golden, infer, load_cases, make_node, reference

from engine.errors import ShapeError
from engine.ops import get_op
from engine.ops.registry import TensorInfo

GOLDENS = Path(__file__).resolve().parents[2] / "fixtures" / "ops" / "nonspatial.npz"
OPS = {"Concat", "Stack", "Split", "Slice", "Gather"}
CASES = load_cases(GOLDENS, OPS)
RNG = np.random.default_rng(7)


def _x(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_every_op_has_goldens():
    assert {c.op for c in CASES} == OPS


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_matches_torch(case):
    check_golden(case, rtol=0, atol=0)


def test_values_propagate_through_shape_arithmetic():
    dims = np.array([2, 3, 224, 224], np.int64)
    (g,) = infer(make_node("Gather", 2, params={"axis": 0}), [dims, np.array(0, np.int64)], values=True)
    assert g.shape == () and int(g.value) == 2
    (s,) = infer(make_node("Slice", 1, params={"starts": [2], "ends": [4]}), [dims], values=True)
    np.testing.assert_array_equal(s.value, [224, 224])
    (c,) = infer(make_node("Concat", 2, params={"axis": 0}), [np.array([-1], np.int64), s.value], values=True)
    np.testing.assert_array_equal(c.value, [-1, 224, 224])
    (st,) = infer(make_node("Stack", 2, params={"axis": 0}), [np.array(1, np.int64), np.array(5, np.int64)],
                  values=True)
    np.testing.assert_array_equal(st.value, [1, 5])
    outs = infer(make_node("Split", 1, 2, params={"axis": 0, "sizes": [1, 3]}), [dims], values=True)
    np.testing.assert_array_equal(outs[1].value, [3, 224, 224])
    (partial,) = infer(make_node("Concat", 2, params={"axis": 0}), [dims, dims])
    assert partial.value is None


def test_errors_name_the_node():
    with pytest.raises(ShapeError, match="test:1: Concat on axis 1 of mismatched shapes"):
        infer(make_node("Concat", 2, params={"axis": 1}), [np.zeros((2, 3)), np.zeros((3, 3))])
    with pytest.raises(ShapeError, match="test:1: Split sizes"):
        infer(make_node("Split", 1, 2, params={"axis": 0, "sizes": [1, 1]}), [np.zeros(3)])
    with pytest.raises(ShapeError, match="test:1: Slice step 0"):
        infer(make_node("Slice", 1, params={"starts": [0], "ends": [1], "steps": [0]}), [np.zeros(3)])
    with pytest.raises(ShapeError, match=r"test:1: Gather index out of range \[-3, 3\)"):
        reference(make_node("Gather", 2), [np.zeros(3), np.array([3])])
    with pytest.raises(ShapeError, match="out of range"):
        infer(make_node("Gather", 2), [np.zeros(3), np.array([-4])], values=True)
    with pytest.raises(ShapeError, match="indices must be integers"):
        infer(make_node("Gather", 2), [np.zeros(3), np.zeros(2, np.float32)])


# -- Slice with bounds given as inputs (run-time bounds computed from shapes) ------------------------------------
def _infos(arrays):
    """Bound inputs are host values: known to infer, as the runtime computes them per input signature."""
    return [TensorInfo(a.shape, a.dtype, None if i == 0 else a) for i, a in enumerate(arrays)]


def test_slice_scalar_and_negative_bounds_as_inputs():
    x = _x(3, 7)
    node = make_node("Slice", 4, params={"axes": [-1]})
    ins = [x, np.array(-2, np.int64), np.array(0, np.int32), np.array(-1, np.int64)]
    np.testing.assert_array_equal(reference(node, ins)[0], x[:, -2:0:-1])
    dims = np.array([4, 8, 6], np.int64)  # shape arithmetic: the value propagates
    (s,) = get_op("Slice").infer(node, [TensorInfo((3,), np.int64, dims), *_infos(ins)[1:]])
    np.testing.assert_array_equal(s.value, dims[-2:0:-1])


def test_slice_bound_input_unknown_before_running_is_a_shape_error():
    node = make_node("Slice", 3, params={"axes": [0]})
    ins = [TensorInfo((4,), np.float32), TensorInfo((1,), np.int64), TensorInfo((1,), np.int64)]
    with pytest.raises(ShapeError, match="test:1: Slice starts input is not known before running"):
        get_op("Slice").infer(node, ins)
    with pytest.raises(ShapeError, match="Slice ends must be a list of ints"):
        reference(node, [np.zeros(4), np.array([0]), np.array([1.5])])
