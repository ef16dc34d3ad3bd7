"""TNN's NonZero and NonMaxSuppression, whose output size depends on the data: int32 results at their actual
shapes, as TNN's CPU accs compute them (NonZero tests bytes, so -0.0 counts; NMS filters scores by `>`), the
nodes after them following that size, and a layer that could not follow it refused at load with its line."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import UnsupportedOpError
from tests.engine.formats.tnn.test_tnn_lowering import tnn_model

BOXES = np.array([[[0.0, 0.0, 1.0, 1.0], [0.0, 0.1, 1.0, 1.1], [0.0, -0.1, 1.0, 0.9],
                   [0.0, 10.0, 1.0, 11.0], [0.0, 10.1, 1.0, 11.1], [0.0, 100.0, 1.0, 101.0]]], np.float32)
SCORES = np.array([[[0.9, 0.75, 0.6, 0.95, 0.5, 0.3], [0.1, 0.0, 0.2, 0.0, 0.0, 0.05]]], np.float32)


def test_nonzero_then_permute_and_cast(tmp_path):
    layers = ["NonZero n 1 1 x t", "Permute p 1 1 t pt 2 1 0", "Cast c 1 1 pt y 0"]
    model = tnn_model(tmp_path, "x 2 3 4 0", layers, "t y")
    assert {s.name: s.shape for s in model.outputs} == {"t": (2, -1), "y": (-1, 2)}
    inst = model.instance()
    for x in (np.array([[0, 1, 0, 0], [2, 0, 0, -0.0], [0, 0, 3, 0]], np.float32), np.zeros((3, 4), np.float32)):
        out = inst.run({"x": x})
        want = np.stack(np.nonzero(x.view(np.uint32)))  # TNN's byte test: -0.0 is not zero
        assert out["t"].dtype == np.int32 and out["y"].dtype == np.float32
        np.testing.assert_array_equal(out["t"], want)
        np.testing.assert_array_equal(out["y"], want.T)
    assert inst.run({"x": np.array([[0, 1, 0, 0], [2, 0, 0, -0.0], [0, 0, 3, 0]], np.float32)})["t"].shape == (2, 4)


@pytest.mark.parametrize("center_point_box, boxes", [(0, BOXES), (1, np.concatenate(
    [(BOXES[..., 1::-1] + BOXES[..., :1:-1]) / 2, BOXES[..., :1:-1] - BOXES[..., 1::-1]], -1))])
def test_non_max_suppression(tmp_path, center_point_box, boxes):
    layers = [f"NonMaxSuppression n 2 1 boxes scores y {center_point_box} 3 0.5 0.1"]
    model = tnn_model(tmp_path, "boxes 3 1 6 4 0 : scores 3 1 2 6 0", layers, "y")
    assert model.outputs[0].shape == (-1, 3)
    inst = model.instance()
    out = inst.run({"boxes": boxes, "scores": SCORES})["y"]
    # class 0 as ONNX's suppress_by_IOU case; class 1 keeps box 2 only (0.2: its 0.1 is not above the threshold)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [[0, 0, 3], [0, 0, 0], [0, 0, 5], [0, 1, 2]])
    assert inst.run({"boxes": boxes, "scores": SCORES * 0})["y"].shape == (0, 3)


def test_a_layer_that_cannot_follow_the_size_is_refused_with_its_line(tmp_path):
    layers = ["NonZero n 1 1 x t", "Cast c 1 1 t f 0", "Softmax s 1 1 f y 1"]
    with pytest.raises(UnsupportedOpError, match="cannot follow a size known only at run time") as e:
        tnn_model(tmp_path, "x 2 3 4 0", layers, "y")
    assert "m.tnnproto:8" in str(e.value) and "Softmax" in str(e.value)
