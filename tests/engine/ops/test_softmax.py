"""Softmax / LogSoftmax: goldens (stability, every axis), kernel vs reference at and below max shape, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_golden, check_kernel, infer, kernel_peak_bytes, load_cases, make_node

from engine.errors import ShapeError

GOLDENS = Path(__file__).resolve().parents[2] / "fixtures" / "ops" / "misc.npz"
CASES = load_cases(GOLDENS, {"Softmax", "LogSoftmax"})
RNG = np.random.default_rng(3)


def test_goldens_cover_both_ops():
    assert {c.op for c in CASES} == {"Softmax", "LogSoftmax"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_matches_torch(case):
    check_golden(case, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [0, 1, -1, -2])
def test_kernel_matches_reference(op, axis):
    x = (RNG.standard_normal((3, 5, 7)) * 5).astype(np.float32)
    x[0, 0, 0] = 90.0
    node = make_node(op, 1, params={"axis": axis})
    check_kernel(node, [x])
    check_kernel(node, [x[:2, :4, :3].copy()], [x])


def test_kernel_rows_sum_to_one_and_handle_infinities():
    x = RNG.standard_normal((4, 9)).astype(np.float32)
    x[1, :4] = -np.inf  # masked positions
    node = make_node("Softmax", 1, params={"axis": -1})
    check_kernel(node, [x])
    check_kernel(make_node("LogSoftmax", 1, params={"axis": 1}), [x])


def test_integer_input_gives_float32():
    x = np.arange(12, dtype=np.int64).reshape(3, 4)
    (info,) = infer(make_node("Softmax", 1, params={"axis": 1}), [x])
    assert info.dtype == np.float32
    check_kernel(make_node("Softmax", 1, params={"axis": 1}), [x])


def test_bad_axis_names_the_node():
    with pytest.raises(ShapeError, match="test:1: Softmax axis 3 out of range for rank 3"):
        infer(make_node("Softmax", 1, params={"axis": 3}), [np.zeros((2, 3, 4), np.float32)])


@pytest.mark.parametrize("axis", [1, -1])
def test_kernel_allocates_no_temporaries(axis):
    x = RNG.standard_normal((4, 16, 32, 32)).astype(np.float32)
    assert kernel_peak_bytes(make_node("Softmax", 1, params={"axis": axis}), [x]) < 16 * 1024


def test_float16_runs_through_the_reference_path():
    x = RNG.standard_normal((3, 8)).astype(np.float16)
    check_kernel(make_node("Softmax", 1, params={"axis": -1}), [x], rtol=1e-3, atol=1e-3)
