"""Reductions and ArgMax/ArgMin: goldens (axes lists, negative axes, keepdims, all), values, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_golden, infer, load_cases, make_node

from engine.errors import ShapeError
from engine.ops import reduce

GOLDENS = Path(__file__).resolve().parents[2] / "fixtures" / "ops" / "nonspatial.npz"
OPS = set(reduce.REDUCERS) | {"ArgMax", "ArgMin"}
CASES = load_cases(GOLDENS, OPS)


def test_every_op_has_goldens():
    assert {c.op for c in CASES} == OPS


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_matches_torch(case):
    check_golden(case, rtol=1e-5, atol=1e-6)


def test_values_propagate():
    shape = np.array([2, 3, 4], np.int64)
    (info,) = infer(make_node("ReduceProd", 1, params={"axes": None, "keepdims": False}), [shape], values=True)
    assert info.shape == () and int(info.value) == 24
    (info,) = infer(make_node("ArgMax", 1, params={"axis": 0}), [shape], values=True)
    assert int(info.value) == 2


def test_errors_name_the_node():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ShapeError, match="test:1: ReduceSum axis 2 out of range"):
        infer(make_node("ReduceSum", 1, params={"axes": [2]}), [x])
    with pytest.raises(ShapeError, match="test:1: ArgMax axis -3"):
        infer(make_node("ArgMax", 1, params={"axis": -3}), [x])
    with pytest.raises(ShapeError, match="empty axis"):
        infer(make_node("ReduceMax", 1, params={"axes": [0]}), [np.zeros((0, 3), np.float32)])
    with pytest.raises(ShapeError, match="ArgMin over an empty axis"):
        infer(make_node("ArgMin", 1, params={"axis": 1}), [np.zeros((2, 0), np.float32)])
