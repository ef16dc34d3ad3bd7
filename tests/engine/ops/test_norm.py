"""BatchNorm, LayerNorm, GroupNorm, InstanceNorm, LpNormalize: goldens, infer, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_golden, infer, load_cases, make_node

from engine.errors import ShapeError

GOLDENS = Path(__file__).resolve().parents[2] / "fixtures" / "ops" / "misc.npz"
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
