"""Gemm and MatMul: references vs PyTorch goldens, infer, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_golden, check_kernel, infer, load_cases, make_node, reference

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


@pytest.mark.parametrize("equation, shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]), ("ij,ij->", [(3, 4), (3, 4)]),
    ("i,j", [(3,), (4,)]), ("...ij,...jk", [(2, 1, 3, 4), (5, 4, 2)]), ("bij->bji", [(2, 3, 4)]),
    ("ii->i", [(3, 3)]), ("b...d,bd->b...", [(2, 3, 4, 5), (2, 5)])])
def test_einsum_is_numpys_einsum_summed_term_by_term(equation, shapes):
    rng = np.random.default_rng(len(equation))
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    node = make_node("Einsum", len(xs), params={"equation": equation})
    (out,) = reference(node, xs)
    (info,) = infer(node, xs)
    want = np.einsum(equation, *[x.astype(np.float64) for x in xs])
    assert tuple(info.shape) == want.shape == out.shape and out.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    check_kernel(node, xs, rtol=1e-5, atol=1e-5)


def test_einsum_matmul_against_explicit_sums():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    (out,) = reference(make_node("Einsum", 2, params={"equation": "ij,jk->ik"}), [a, b])
    want = [[sum(float(a[i, j]) * float(b[j, k]) for j in range(3)) for k in range(4)] for i in range(2)]
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("equation, shapes, match", [
    ("ij,jk->ik", [(3, 4), (5, 6)], "label 'j'"), ("ij,jk", [(3, 4)], "names 2 operands"),
    ("ij->iz", [(3, 4)], "names one no operand"), ("i.j->i", [(3, 4)], "letters"), ("ijk->i", [(3, 4)], "rank-2")])
def test_einsum_refusals_name_the_node(equation, shapes, match):
    xs = [np.zeros(s, np.float32) for s in shapes]
    with pytest.raises(ShapeError, match=match):
        infer(make_node("Einsum", len(xs), params={"equation": equation}), xs)
