"""Pad's CPU kernel vs the reference on any rank and dtype, every mode with crops, below max shape."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_kernel, load_cases, make_node

GOLDENS = Path(__file__).resolve().parents[3] / "fixtures" / "ops" / "spatial.npz"
CASES = load_cases(GOLDENS, {"Pad"})
RNG = np.random.default_rng(9)


def pad_node(pads, mode="constant", value=0.0):
    return make_node("Pad", 1, params={"pads": list(pads), "mode": mode, "value": value})


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernel_matches_reference(case):
    check_kernel(case.node(), case.inputs, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "circular"])
@pytest.mark.parametrize("pads", [(1, 0, 2, 3, 0, 1, 2, 1), (0, 1, -1, 1, 1, -1, 3, 0), (0, 0, 0, 0, 0, 0, 0, 0)])
def test_kernel_every_mode_with_crops_below_max(mode, pads):
    node = pad_node(pads, mode, value=-2.5)
    small, big = RNG.standard_normal((2, 4, 5, 6)).astype(np.float32), np.zeros((3, 5, 7, 8), np.float32)
    check_kernel(node, [small], [big], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [np.int64, np.float64, np.uint8])
def test_kernel_other_dtypes_and_ranks(dtype):
    x = (RNG.standard_normal((3, 5)) * 10).astype(dtype)
    for mode in ("constant", "reflect", "edge", "circular"):
        check_kernel(pad_node((1, 2, 2, 3), mode, value=7), [x], rtol=0, atol=0)
    check_kernel(pad_node((2, 1), "reflect"), [np.arange(4, dtype=dtype)], rtol=0, atol=0)
