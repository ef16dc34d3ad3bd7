"""NonZero and NonMaxSuppression: the numpy references against ONNX's own test cases and hand-worked answers
(onnx/backend/test/case/node/nonmaxsuppression.py, nonzero.py), their upper bounds, and what they refuse."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import infer, make_node, reference

from engine.errors import ShapeError

# ONNX's NonMaxSuppression cases: one batch, one class, six boxes in three overlapping pairs
CORNERS = [[0.0, 0.0, 1.0, 1.0], [0.0, 0.1, 1.0, 1.1], [0.0, -0.1, 1.0, 0.9],
           [0.0, 10.0, 1.0, 11.0], [0.0, 10.1, 1.0, 11.1], [0.0, 100.0, 1.0, 101.0]]
FLIPPED = [[1.0, 1.0, 0.0, 0.0], [0.0, 0.1, 1.0, 1.1], [0.0, 0.9, 1.0, -0.1],
           [0.0, 10.0, 1.0, 11.0], [1.0, 10.1, 0.0, 11.1], [1.0, 101.0, 0.0, 100.0]]
CENTERS = [[0.5, 0.5, 1.0, 1.0], [0.5, 0.6, 1.0, 1.0], [0.5, 0.4, 1.0, 1.0],
           [0.5, 10.5, 1.0, 1.0], [0.5, 10.6, 1.0, 1.0], [0.5, 100.5, 1.0, 1.0]]
SCORES = [0.9, 0.75, 0.6, 0.95, 0.5, 0.3]


def nms(boxes, scores, **params) -> np.ndarray:
    params = {"iou_threshold": 0.5, "score_threshold": 0.0, **params}
    node = make_node("NonMaxSuppression", 2, params=params)
    b, s = np.array(boxes, np.float32), np.array(scores, np.float32)
    (bound,) = infer(node, [b, s])
    (got,) = reference(node, [b, s])
    assert got.dtype == np.dtype(params.get("dtype", "int64")) and got.shape[1:] == (3,)
    assert got.shape[0] <= bound.shape[0] and bound.shape[1] == 3
    return got


@pytest.mark.parametrize("boxes, center", [(CORNERS, 0), (FLIPPED, 0), (CENTERS, 1)])
def test_nms_suppresses_by_iou_in_each_box_format(boxes, center):
    got = nms([boxes], [[SCORES]], max_output_boxes_per_class=3, center_point_box=center)
    np.testing.assert_array_equal(got, [[0, 0, 3], [0, 0, 0], [0, 0, 5]])


def test_nms_limits_the_boxes_per_class_and_filters_by_score():
    np.testing.assert_array_equal(nms([CORNERS], [[SCORES]], max_output_boxes_per_class=2), [[0, 0, 3], [0, 0, 0]])
    got = nms([CORNERS], [[SCORES]], max_output_boxes_per_class=3, score_threshold=0.4)
    np.testing.assert_array_equal(got, [[0, 0, 3], [0, 0, 0]])
    # strictly above the threshold: a score equal to it is no candidate (TNN's and ONNX Runtime's `>`)
    got = nms([CORNERS], [[SCORES]], max_output_boxes_per_class=3, score_threshold=0.3)
    np.testing.assert_array_equal(got, [[0, 0, 3], [0, 0, 0]])


def test_nms_batches_and_classes_in_order():
    got = nms([CORNERS, CORNERS], [[SCORES], [SCORES]], max_output_boxes_per_class=2)
    np.testing.assert_array_equal(got, [[0, 0, 3], [0, 0, 0], [1, 0, 3], [1, 0, 0]])
    got = nms([CORNERS], [[SCORES, SCORES]], max_output_boxes_per_class=2, dtype="int32")
    np.testing.assert_array_equal(got, [[0, 0, 3], [0, 0, 0], [0, 1, 3], [0, 1, 0]])


def test_nms_identical_boxes_and_ties():
    got = nms([[[0.0, 0.0, 1.0, 1.0]] * 10], [[[0.9] * 10]], max_output_boxes_per_class=3)
    np.testing.assert_array_equal(got, [[0, 0, 0]])
    # equal scores, apart: the lower box index first
    apart = [[0.0, 0.0, 1.0, 1.0], [0.0, 5.0, 1.0, 6.0], [0.0, 2.0, 1.0, 3.0]]
    got = nms([apart], [[[0.5, 0.7, 0.7]]], max_output_boxes_per_class=3)
    np.testing.assert_array_equal(got, [[0, 0, 1], [0, 0, 2], [0, 0, 0]])


def test_nms_zero_area_boxes_suppress_nothing():
    boxes = [[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]]  # two degenerate lines
    got = nms([boxes], [[[0.9, 0.8, 0.7]]], max_output_boxes_per_class=3)
    np.testing.assert_array_equal(got, [[0, 0, 0], [0, 0, 1], [0, 0, 2]])


def test_nms_empty_results():
    assert nms([CORNERS], [[SCORES]], max_output_boxes_per_class=3, score_threshold=0.99).shape == (0, 3)
    assert nms([CORNERS], [[SCORES]], max_output_boxes_per_class=0).shape == (0, 3)


def test_nms_bound():
    node = make_node("NonMaxSuppression", 2, params={"max_output_boxes_per_class": 4})
    (bound,) = infer(node, [np.zeros((2, 6, 4), np.float32), np.zeros((2, 3, 6), np.float32)])
    assert bound.shape == (2 * 3 * 4, 3)  # batch * classes * min(max per class, boxes)
    node.params["max_output_boxes_per_class"] = 100
    (bound,) = infer(node, [np.zeros((2, 6, 4), np.float32), np.zeros((2, 3, 6), np.float32)])
    assert bound.shape == (2 * 3 * 6, 3)


@pytest.mark.parametrize("shapes, params, match", [
    (((1, 6, 4), (1, 1, 5)), {}, "takes boxes"),
    (((1, 6, 3), (1, 1, 6)), {}, "takes boxes"),
    (((1, 6, 4), (1, 1, 6)), {"center_point_box": 2}, "center_point_box"),
    (((1, 6, 4), (1, 1, 6)), {"dtype": "float32"}, "dtype"),
])
def test_nms_refuses(shapes, params, match):
    node = make_node("NonMaxSuppression", 2, params=params)
    with pytest.raises(ShapeError, match=match):
        infer(node, [np.zeros(s, np.float32) for s in shapes])


def test_nonzero_indices_in_c_order():
    x = np.array([[1, 0], [1, 1]], np.float32)
    node = make_node("NonZero", 1)
    (bound,) = infer(node, [x])
    assert bound.shape == (2, 4) and bound.dtype == np.int64
    np.testing.assert_array_equal(reference(node, [x])[0], [[0, 1, 1], [0, 0, 1]])
    x3 = np.zeros((2, 3, 2), np.int32)
    x3[1, 2, 0] = x3[0, 0, 1] = 5
    np.testing.assert_array_equal(reference(node, [x3])[0], [[0, 1], [0, 2], [1, 0]])


def test_nonzero_empty_and_full():
    node = make_node("NonZero", 1, params={"dtype": "int32"})
    got = reference(node, [np.zeros((3, 4), np.float32)])[0]
    assert got.shape == (2, 0) and got.dtype == np.int32
    got = reference(node, [np.ones(5, bool)])[0]
    np.testing.assert_array_equal(got, [[0, 1, 2, 3, 4]])


def test_nonzero_negative_zero_by_value_and_by_bits():
    x = np.array([0.0, -0.0, 2.0, np.nan], np.float32)
    np.testing.assert_array_equal(reference(make_node("NonZero", 1), [x])[0], [[2, 3]])
    # TNN tests the bytes: -0.0 has its sign bit set
    np.testing.assert_array_equal(reference(make_node("NonZero", 1, params={"zero": "bits"}), [x])[0], [[1, 2, 3]])


def test_nonzero_of_a_known_value_is_known():
    (info,) = infer(make_node("NonZero", 1), [np.array([0, 3, 0, 4], np.int64)], values=True)
    assert info.shape == (1, 2)
    np.testing.assert_array_equal(info.value, [[1, 3]])


def test_nonzero_refuses_a_scalar():
    with pytest.raises(ShapeError, match="0-d"):
        infer(make_node("NonZero", 1), [np.float32(1)])
