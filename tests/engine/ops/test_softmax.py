"""Softmax / LogSoftmax: goldens (stability, every axis), dtypes, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_golden, infer, load_cases, make_node

from engine.errors import ShapeError

GOLDENS = Path(__file__).resolve().parents[2] / "fixtures" / "ops" / "nonspatial.npz"
CASES = load_cases(GOLDENS, {"Softmax", "LogSoftmax"})


def test_goldens_cover_both_ops():
    assert {c.op for c in CASES} == {"Softmax", "LogSoftmax"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_matches_torch(case):
    check_golden(case, rtol=1e-5, atol=1e-6)


def test_bad_axis_names_the_node():
    with pytest.raises(ShapeError, match="test:1: Softmax axis 3 out of range for rank 3"):
        infer(make_node("Softmax", 1, params={"axis": 3}), [np.zeros((2, 3, 4), np.float32)])
