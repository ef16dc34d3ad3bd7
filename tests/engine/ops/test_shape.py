"""Layout-only ops: references vs goldens, Shape as a host value, value propagation, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_golden, infer, load_cases, make_node, reference

from engine.errors import ShapeError
from engine.ops import get_op
from engine.ops.registry import TensorInfo

GOLDENS = Path(__file__).resolve().parents[2] / "fixtures" / "ops" / "nonspatial.npz"
OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Expand", "Tile", "Cast", "Shape"}
CASES = load_cases(GOLDENS, OPS)


def test_every_op_has_goldens():
    assert {c.op for c in CASES} == OPS


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_matches_torch(case):
    check_golden(case, rtol=0, atol=0)


def test_shape_is_always_a_host_value():
    (info,) = infer(make_node("Shape", 1, params={"start": -2}), [np.zeros((2, 3, 4), np.float32)])
    assert info.shape == (2,) and info.dtype == np.int64
    np.testing.assert_array_equal(info.value, [3, 4])


def test_shape_arithmetic_propagates_values():
    x = np.zeros((2, 3, 4, 5), np.float32)
    (shape,) = infer(make_node("Shape", 1), [x])
    (flat,) = get_op("Reshape").infer(make_node("Reshape", 1, params={"shape": [-1]}), [shape])
    np.testing.assert_array_equal(flat.value, [2, 3, 4, 5])
    (unsq,) = get_op("Unsqueeze").infer(make_node("Unsqueeze", 1, params={"axes": [0]}), [shape])
    assert unsq.value.shape == (1, 4)
    (sq,) = get_op("Squeeze").infer(make_node("Squeeze", 1, params={"axes": [0]}), [unsq])
    np.testing.assert_array_equal(sq.value, [2, 3, 4, 5])
    (cast,) = get_op("Cast").infer(make_node("Cast", 1, params={"to": "int32"}), [shape])
    assert cast.value.dtype == np.int32
    (tr,) = get_op("Transpose").infer(make_node("Transpose", 1), [unsq])
    assert tr.value.shape == (4, 1)
    (noval,) = infer(make_node("Reshape", 1, params={"shape": [-1]}), [x])
    assert noval.value is None


def test_squeeze_keeps_non_unit_dims_like_torch():
    (y,) = reference(make_node("Squeeze", 1, params={"axes": [0, 1]}), [np.zeros((1, 3, 1))])
    assert y.shape == (3, 1)


@pytest.mark.parametrize("op,params,shape,match", [
    ("Reshape", {"shape": [4, -1]}, (2, 3), "cannot reshape"),
    ("Reshape", {"shape": [-1, -1]}, (2, 3), "invalid"),
    ("Reshape", {}, (2, 3), "neither a shape input nor a shape param"),
    ("Flatten", {"start_dim": 2, "end_dim": 1}, (2, 3, 4), "after end_dim"),
    ("Unsqueeze", {"axes": [0, 0]}, (2,), "repeat"),
    ("Transpose", {"perm": [0, 0]}, (2, 3), "not a permutation"),
    ("Expand", {"shape": [4, 3]}, (2, 3), "cannot expand"),
    ("Tile", {"repeats": [-1]}, (2,), "repeats"),
    ("Squeeze", {"axes": [5]}, (2, 3), "axis 5 out of range"),
])
def test_errors_name_the_node(op, params, shape, match):
    with pytest.raises(ShapeError, match=f"test:1.*{match}"):
        infer(make_node(op, 1, params=params), [np.zeros(shape, np.float32)])


def test_unknown_shape_input_is_an_error():
    ins = [TensorInfo((2, 3), np.dtype(np.float32)), TensorInfo((2,), np.dtype(np.int64))]
    with pytest.raises(ShapeError, match="not known before running"):
        get_op("Reshape").infer(make_node("Reshape", 2), ins)


@pytest.mark.parametrize("params,shapes,match", [
    ({"indexing": "ji"}, [(3,), (4,)], "indexing"),
    ({"indexing": "ij"}, [(3, 1), (4,)], "0-d or 1-D"),
])
def test_meshgrid_errors_name_the_node(params, shapes, match):
    node = make_node("Meshgrid", len(shapes), len(shapes), params=params)
    with pytest.raises(ShapeError, match=match):
        infer(node, [np.zeros(s, np.float32) for s in shapes])


def test_meshgrid_refuses_mixed_dtypes_and_a_wrong_output_count():
    with pytest.raises(ShapeError, match="dtype"):
        infer(make_node("Meshgrid", 2, 2), [np.zeros(3, np.float32), np.zeros(4, np.int64)])
    with pytest.raises(ShapeError, match="outputs"):
        infer(make_node("Meshgrid", 2, 1), [np.zeros(3, np.float32), np.zeros(4, np.float32)])
