"""Gemm and MatMul: references vs PyTorch goldens, infer, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_golden, infer, load_cases, make_node, reference

from engine.errors import ShapeError, UnsupportedOpError

GOLDENS = Path(__file__).resolve().parents[2] / "fixtures" / "ops" / "spatial.npz"
CASES = load_cases(GOLDENS, {"Gemm", "MatMul"})
RNG = np.random.default_rng(3)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def gemm_node(k: int, n: int, bias: bool = True, **params):
    attrs = {"weight": rand(n, k)}
    if bias:
        attrs["bias"] = rand(n)
    return make_node("Gemm", 1, params=params, attrs=attrs)


def test_goldens_cover_both_ops():
    assert {c.op for c in CASES} == {"Gemm", "MatMul"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_matches_torch(case):
    check_golden(case, rtol=1e-5, atol=1e-5)


def test_gemm_reference_is_x_times_weight_transposed_plus_bias():
    node = gemm_node(3, 2)
    x = rand(4, 3)
    w, b = node.attrs["weight"], node.attrs["bias"]
    want = np.array([[sum(float(x[i, k]) * float(w[j, k]) for k in range(3)) + float(b[j]) for j in range(2)]
                     for i in range(4)])
    np.testing.assert_allclose(reference(node, [x])[0], want, rtol=1e-6, atol=1e-6)


def test_matmul_keeps_integers_exact():
    a, b = np.arange(6, dtype=np.int64).reshape(2, 3), np.arange(6, dtype=np.int64).reshape(3, 2)
    got = reference(make_node("MatMul", 2), [a, b])[0]
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, a @ b)


def test_errors():
    with pytest.raises(ShapeError, match="K=4") as err:
        infer(gemm_node(4, 2), [rand(3, 5)])
    assert "test:1" in str(err.value)
    with pytest.raises(ShapeError, match="weight"):
        infer(make_node("Gemm", 1), [rand(3, 5)])
    with pytest.raises(UnsupportedOpError, match="mystery"):
        infer(gemm_node(4, 2, activation="mystery"), [rand(3, 4)])
    bad_bias = make_node("Gemm", 1, attrs={"weight": rand(2, 4), "bias": rand(3)})
    with pytest.raises(ShapeError, match="bias"):
        infer(bad_bias, [rand(3, 4)])
    with pytest.raises(ShapeError, match="inner dims"):
        infer(make_node("MatMul", 2), [rand(3, 4), rand(5, 2)])
    with pytest.raises(ShapeError, match="broadcast"):
        infer(make_node("MatMul", 2), [rand(2, 3, 4), rand(3, 4, 2)])
    with pytest.raises(ShapeError, match="1-D"):
        infer(make_node("MatMul", 2), [np.float32(1.0), rand(3)])
