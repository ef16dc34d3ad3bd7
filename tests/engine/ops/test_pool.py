"""Pooling: references vs PyTorch goldens, output shapes, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_golden, infer, load_cases, make_node, reference

from engine.errors import ShapeError, UnsupportedOpError

OPS = {"MaxPool", "AvgPool", "GlobalAvgPool", "GlobalMaxPool", "AdaptiveAvgPool", "AdaptiveMaxPool"}
GOLDENS = Path(__file__).resolve().parents[2] / "fixtures" / "ops" / "spatial.npz"
CASES = load_cases(GOLDENS, OPS)
RNG = np.random.default_rng(5)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_goldens_cover_every_pool():
    assert {c.op for c in CASES} == OPS


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_matches_torch(case):
    check_golden(case, rtol=1e-5, atol=1e-5)


def test_stride_defaults_to_kernel():
    node = make_node("MaxPool", 1, params={"kernel": [2, 2]})
    assert infer(node, [rand(1, 1, 6, 7)])[0].shape == (1, 1, 3, 3)


def test_avgpool_divisor_at_edges_matches_a_plain_loop():
    """count_include_pad + ceil_mode: the edge window counts pads but not the ceil overhang (torch rule)."""
    x = rand(1, 1, 5, 5)
    node = make_node("AvgPool", 1, params={"kernel": [3, 3], "stride": [2, 2], "pads": [1, 1, 1, 1],
                                           "ceil_mode": True})
    got = reference(node, [x])[0][0, 0]
    want = np.zeros((3, 3))
    for i in range(3):
        for j in range(3):
            h0, w0 = 2 * i - 1, 2 * j - 1
            h1, w1 = min(h0 + 3, 6), min(w0 + 3, 6)
            area = (h1 - h0) * (w1 - w0)
            want[i, j] = x[0, 0, max(h0, 0):min(h1, 5), max(w0, 0):min(w1, 5)].sum() / area
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("op,params,shape,match", [
    ("MaxPool", {}, (1, 3, 5, 5), "positive kernel"),
    ("MaxPool", {"kernel": [3, 3]}, (1, 3, 2, 5), "smaller than the kernel"),
    ("AvgPool", {"kernel": [2, 2]}, (3, 5, 5), "rank-4"),
    ("GlobalAvgPool", {}, (3, 5), "spatial"),
    ("AdaptiveAvgPool", {"output_size": [0, 2]}, (1, 3, 5, 5), "positive"),
    ("AdaptiveMaxPool", {"output_size": [1, 2, 3]}, (1, 3, 5, 5), "pair"),
])
def test_errors_name_the_node(op, params, shape, match):
    with pytest.raises(ShapeError, match=match) as err:
        infer(make_node(op, 1, params=params), [np.zeros(shape, np.float32)])
    assert "test:1" in str(err.value)


def test_unknown_auto_pad_is_unsupported():
    with pytest.raises(UnsupportedOpError, match="auto_pad='full'"):
        infer(make_node("AvgPool", 1, params={"kernel": [2, 2], "auto_pad": "full"}), [rand(1, 3, 5, 5)])
