"""Pad: references vs PyTorch goldens (every mode, crops), the modes' definitions, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_golden, infer, load_cases, make_node, reference

from engine.errors import ShapeError, UnsupportedOpError

GOLDENS = Path(__file__).resolve().parents[2] / "fixtures" / "ops" / "spatial.npz"
CASES = load_cases(GOLDENS, {"Pad"})


def pad_node(pads, mode="constant", value=0.0):
    return make_node("Pad", 1, params={"pads": list(pads), "mode": mode, "value": value})


def test_goldens_cover_every_mode():
    assert {c.params["mode"] for c in CASES} == {"constant", "reflect", "edge", "circular"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_matches_torch(case):
    check_golden(case, rtol=0, atol=0)


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
