"""Pad: references vs PyTorch goldens (every mode, crops), kernel vs reference on any rank and dtype, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_golden, check_kernel, infer, load_cases, make_node, reference

from engine.errors import ShapeError, UnsupportedOpError

GOLDENS = Path(__file__).resolve().parents[2] / "fixtures" / "ops" / "spatial.npz"
CASES = load_cases(GOLDENS, {"Pad"})
RNG = np.random.default_rng(9)


def pad_node(pads, mode="constant", value=0.0):
    return make_node("Pad", 1, params={"pads": list(pads), "mode": mode, "value": value})


def test_goldens_cover_every_mode():
    assert {c.params["mode"] for c in CASES} == {"constant", "reflect", "edge", "circular"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_matches_torch(case):
    check_golden(case, rtol=0, atol=0)


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


def test_reflect_is_mirror_without_edge():
    y = reference(pad_node((2, 3), "reflect"), [np.arange(4.0)])[0]
    np.testing.assert_array_equal(y, [2, 1, 0, 1, 2, 3, 2, 1, 0])
    y = reference(pad_node((2, 3), "circular"), [np.arange(4.0)])[0]
    np.testing.assert_array_equal(y, [2, 3, 0, 1, 2, 3, 0, 1, 2])


@pytest.mark.parametrize("pads,mode,shape,match", [
    ((1, 1), "constant", (2, 3), "ONNX order"),
    ((0, 3, 0, 0), "reflect", (2, 3), "too large"),
    ((0, 4, 0, 0), "circular", (2, 3), "too large"),
    ((0, -2, 0, -2), "constant", (2, 3), "nothing is left"),
])
def test_errors_name_the_node(pads, mode, shape, match):
    with pytest.raises(ShapeError, match=match) as err:
        infer(pad_node(pads, mode), [np.zeros(shape, np.float32)])
    assert "test:1" in str(err.value)


def test_unknown_mode_is_unsupported():
    with pytest.raises(UnsupportedOpError, match="symmetric") as err:
        infer(pad_node((0, 1, 0, 0), "symmetric"), [np.zeros((2, 3), np.float32)])
    assert "pad_0" in str(err.value)
