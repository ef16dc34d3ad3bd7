"""Attention: goldens (scale, float/bool masks, fully masked rows, causal), errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_golden, infer, load_cases, make_node

from engine.errors import ShapeError

GOLDENS = Path(__file__).resolve().parents[2] / "fixtures" / "ops" / "nonspatial.npz"
CASES = load_cases(GOLDENS, {"Attention"})


def test_goldens_present():
    assert len(CASES) >= 5


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_matches_torch(case):
    check_golden(case, rtol=1e-5, atol=2e-6)


def test_errors_name_the_node():
    q = np.zeros((2, 5, 8), np.float32)
    with pytest.raises(ShapeError, match="test:1: Attention shapes"):
        infer(make_node("Attention", 3), [q, np.zeros((2, 5, 7), np.float32), q])
    with pytest.raises(ShapeError, match="test:1: Attention (mask|cannot broadcast)"):
        infer(make_node("Attention", 4), [q, q, q, np.zeros((3, 5, 5), np.float32)])
    with pytest.raises(ShapeError, match="q, k, v, \\[mask\\]"):
        infer(make_node("Attention", 2), [q, q])
