"""Activations: references vs PyTorch goldens, infer, errors, and the epilogue's numpy definition against them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_golden, infer, load_cases, make_node

from engine.errors import ShapeError
from engine.ops import activation

GOLDENS = Path(__file__).resolve().parents[2] / "fixtures" / "ops" / "nonspatial.npz"
CASES = load_cases(GOLDENS, set(activation.REFERENCES))
PARAMS = {
    "Relu": {}, "Clip": {"min": -0.3, "max": 0.8}, "LeakyRelu": {"alpha": 0.05}, "Sigmoid": {}, "Tanh": {},
    "Silu": {}, "Gelu": {"approximate": "none"}, "HardSwish": {}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5},
    "Elu": {"alpha": 1.3}, "Mish": {}, "Softplus": {"beta": 1.5, "threshold": 10.0},
}


def test_every_activation_has_goldens():
    assert {c.op for c in CASES} == set(activation.REFERENCES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_matches_torch(case):
    check_golden(case, rtol=1e-5, atol=1e-6)


def test_infer_keeps_shape_and_dtype():
    x = np.zeros((2, 3, 4), np.float64)
    for op in PARAMS:
        (info,) = infer(make_node(op, 1, params=PARAMS[op]), [x])
        assert (info.shape, info.dtype) == ((2, 3, 4), np.float64)


def test_errors_name_the_node():
    with pytest.raises(ShapeError, match="test:1.*slope"):
        infer(make_node("PRelu", 1, attrs={"slope": np.ones(5, np.float32)}), [np.zeros((1, 3, 2), np.float32)])
    with pytest.raises(ShapeError, match="test:1"):
        infer(make_node("Relu", 2), [np.zeros(3), np.zeros(3)])
