"""Softmax / LogSoftmax CPU kernel vs the reference at and below max shape, infinities, float16, no
temporaries."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import check_kernel, infer, kernel_peak_bytes, make_node

RNG = np.random.default_rng(3)


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


@pytest.mark.parametrize("axis", [1, -1])
def test_kernel_allocates_no_temporaries(axis):
    x = RNG.standard_normal((4, 16, 32, 32)).astype(np.float32)
    assert kernel_peak_bytes(make_node("Softmax", 1, params={"axis": axis}), [x]) < 16 * 1024


def test_float16_runs_through_the_reference_path():
    x = RNG.standard_normal((3, 8)).astype(np.float16)
    check_kernel(make_node("Softmax", 1, params={"axis": -1}), [x], rtol=1e-3, atol=1e-3)
