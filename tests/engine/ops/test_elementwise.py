"""Elementwise binaries, Where and unaries: goldens, dtypes, value propagation, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_golden, check_kernel, infer, load_cases, make_node, reference

from engine.errors import ShapeError
from engine.ops import elementwise

GOLDENS = Path(__file__).resolve().parents[2] / "fixtures" / "ops" / "nonspatial.npz"
OPS = set(elementwise.BINARY) | set(elementwise.UNARY) | {"Where"}
CASES = load_cases(GOLDENS, OPS)


def test_every_op_has_goldens():
    assert {c.op for c in CASES} == OPS


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_matches_torch(case):
    check_golden(case, rtol=2e-6, atol=1e-6)


def test_round_is_half_to_even():
    (y,) = reference(make_node("Round", 1), [np.array([0.5, 1.5, 2.5, -0.5, -1.5], np.float32)])
    np.testing.assert_array_equal(y, np.array([0, 2, 2, -0, -2], np.float32))


def test_dtypes_follow_torch_promotion():
    f32, i64, i32 = np.zeros(3, np.float32), np.zeros(3, np.int64), np.zeros(3, np.int32)
    assert infer(make_node("Add", 2), [f32, np.array(1, np.int64)])[0].dtype == np.float32
    assert infer(make_node("Add", 2), [f32, i64])[0].dtype == np.float32
    assert infer(make_node("Add", 2), [i32, i64])[0].dtype == np.int64
    assert infer(make_node("Div", 2), [i32, i64])[0].dtype == np.float32
    assert infer(make_node("Less", 2), [f32, f32])[0].dtype == np.bool_
    assert infer(make_node("And", 2), [i32, i32])[0].dtype == np.int32
    assert infer(make_node("Exp", 1), [i64])[0].dtype == np.float32
    assert infer(make_node("Not", 1), [f32])[0].dtype == np.bool_


def test_values_propagate_for_shape_arithmetic():
    dims = np.array([2, 3, 8], np.int64)
    (info,) = infer(make_node("Mul", 2), [dims, np.array(2, np.int64)], values=True)
    np.testing.assert_array_equal(info.value, [4, 6, 16])
    assert info.value.dtype == np.int64
    (info,) = infer(make_node("FloorDiv", 2), [dims, np.array(2, np.int64)], values=True)
    np.testing.assert_array_equal(info.value, [1, 1, 4])
    (info,) = infer(make_node("Neg", 1), [dims], values=True)
    np.testing.assert_array_equal(info.value, [-2, -3, -8])
    (info,) = infer(make_node("Add", 2), [dims, np.zeros(3, np.float32)])
    assert info.value is None


def test_errors_name_the_node():
    with pytest.raises(ShapeError, match=r"test:1: Add cannot broadcast shapes \(2, 3\), \(4,\)"):
        infer(make_node("Add", 2), [np.zeros((2, 3)), np.zeros(4)])
    with pytest.raises(ShapeError, match="test:1"):
        infer(make_node("Where", 2), [np.zeros(2, bool), np.zeros(2)])
    with pytest.raises(ShapeError, match="test:1"):
        infer(make_node("Exp", 2), [np.zeros(2), np.zeros(2)])
    with pytest.raises(ShapeError, match="negative powers"):
        reference(make_node("Pow", 2), [np.arange(3), np.array(-1)])


def test_promotion_matches_torch_result_type():
    with np.load(GOLDENS) as z:
        rows = [str(r).split("|") for r in z["promotion/table"]]
    assert len(rows) > 300
    for a, da, b, db, want in rows:
        ins = [np.zeros((2,) * int(da), a), np.zeros((2,) * int(db), b)]
        assert infer(make_node("Add", 2), ins)[0].dtype == np.dtype(want), (a, da, b, db)


@pytest.mark.parametrize("direction", ["left", "right"])
@pytest.mark.parametrize("dtype", [np.int32, np.uint32])
def test_bit_shift_is_logical_on_the_32_bits(direction, dtype):
    x = np.array([0, 1, -1, 2 ** 31 - 1, -(2 ** 31), -12345]).astype(dtype)
    node = make_node("BitShift", 1, params={"direction": direction, "bits": 4})
    (out,) = reference(node, [x])
    u = [int(v) & 0xFFFFFFFF for v in x.astype(np.int64)]
    want = [(v << 4) & 0xFFFFFFFF if direction == "left" else v >> 4 for v in u]
    np.testing.assert_array_equal(out, np.array(want, np.uint32).view(dtype))
    check_kernel(node, [x])


def test_bit_shift_refusals_name_the_node():
    with pytest.raises(ShapeError, match="int32 or uint32"):
        infer(make_node("BitShift", 1, params={"direction": "left", "bits": 1}), [np.zeros(3, np.int64)])
    with pytest.raises(ShapeError, match="bits 32"):
        infer(make_node("BitShift", 1, params={"direction": "left", "bits": 32}), [np.zeros(3, np.int32)])
