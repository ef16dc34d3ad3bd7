"""The numpy reference of RoiAlign (engine/ops/roi_align.py) against the vectorised ONNX reference of the TNN
RoiAlign tests, and its input checks."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import TensorInfo
from engine.ops.roi_align import infer, reference
from tests.engine.formats.tnn.test_tnn_roi_align import IDX, ROIS, X, onnx_roi_align


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_reference_matches_onnx_opset10(mode):
    node = Node("RoiAlign", "r", [], [], {"mode": mode, "output_height": 3, "output_width": 2, "sampling_ratio": 0,
                                          "spatial_scale": 0.8})
    ref = onnx_roi_align(X, ROIS, IDX, 1 if mode == "avg" else 0, 3, 2, 0, 0.8)
    np.testing.assert_allclose(reference(node, [X, ROIS, IDX])[0], ref, rtol=1e-5, atol=1e-5)


def test_float_batch_indices_are_a_shape_error():
    node = Node("RoiAlign", "r", [], [], {"mode": "avg", "output_height": 2, "output_width": 2})
    infos = [TensorInfo(X.shape, X.dtype), TensorInfo(ROIS.shape, ROIS.dtype), TensorInfo(IDX.shape, np.float32)]
    with pytest.raises(ShapeError, match="integer batch indices"):
        infer(node, infos)
