"""BatchNorm, LayerNorm, GroupNorm, InstanceNorm, LpNormalize: goldens, infer, errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from op_harness import check_golden, infer, load_cases, make_node, reference

from engine.errors import ShapeError

GOLDENS = Path(__file__).resolve().parents[2] / "fixtures" / "ops" / "nonspatial.npz"
OPS = {"BatchNorm", "LayerNorm", "GroupNorm", "InstanceNorm", "LpNormalize"}
CASES = load_cases(GOLDENS, OPS)


def test_every_op_has_goldens():
    assert {c.op for c in CASES} == OPS


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_matches_torch(case):
    check_golden(case, rtol=1e-5, atol=2e-6)


def test_infer_keeps_shape_and_float_dtype():
    (info,) = infer(make_node("InstanceNorm", 1), [np.zeros((1, 3, 4), np.float64)])
    assert (info.shape, info.dtype) == ((1, 3, 4), np.float64)


def test_errors_name_the_node():
    x = np.zeros((2, 6, 4), np.float32)
    with pytest.raises(ShapeError, match="test:1: GroupNorm: 6 channels do not split into 4 groups"):
        infer(make_node("GroupNorm", 1, params={"num_groups": 4}), [x])
    with pytest.raises(ShapeError, match="test:1: BatchNorm scale has 3 values for 6 channels"):
        infer(make_node("BatchNorm", 1, attrs={"scale": np.ones(3), "bias": np.ones(6)}), [x])
    with pytest.raises(ShapeError, match="test:1: LayerNorm weight has 5 values"):
        infer(make_node("LayerNorm", 1, params={"normalized_ndim": 1}, attrs={"weight": np.ones(5)}), [x])
    with pytest.raises(ShapeError, match="normalized_ndim 4"):
        infer(make_node("LayerNorm", 1, params={"normalized_ndim": 4}), [x])
    with pytest.raises(ShapeError, match="p must be 1 or 2"):
        infer(make_node("LpNormalize", 1, params={"p": 3}), [x])


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_lrn_reference_is_onnxs_formula(size):
    """ONNX LRN, element by element: the window of channel c is [c - floor((size-1)/2), c + ceil((size-1)/2)]."""
    x = np.random.default_rng(size).standard_normal((2, 5, 3)).astype(np.float32)
    alpha, beta, bias = 0.4, 0.6, 1.2
    (y,) = reference(make_node("LRN", 1, params={"size": size, "alpha": alpha, "beta": beta, "bias": bias}), [x])
    want = np.empty_like(x)
    for n, c, i in np.ndindex(*x.shape):
        lo, hi = max(0, c - math.floor((size - 1) / 2)), min(4, c + math.ceil((size - 1) / 2))
        s = sum(float(x[n, j, i]) ** 2 for j in range(lo, hi + 1))
        want[n, c, i] = x[n, c, i] / (bias + alpha / size * s) ** beta
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-7)


def test_lrn_errors_name_the_node():
    with pytest.raises(ShapeError, match="size=0"):
        infer(make_node("LRN", 1, params={}), [np.zeros((1, 3, 2), np.float32)])
    with pytest.raises(ShapeError, match="2-D"):
        infer(make_node("LRN", 1, params={"size": 3}), [np.zeros((1, 3), np.float32)])
