"""The numpy references of Conv3d and Pool3d (engine/ops/volume.py) against the independent loops of the TNN
volume tests (kernel-tap sums, clipped windows), and their shape checks."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import TensorInfo
from engine.ops.volume import conv3d_reference, pool3d_infer, pool3d_reference
from tests.engine.formats.tnn.test_tnn_volume import X5, conv3d_taps, pool3d_loops

RNG = np.random.default_rng(37)


def test_conv3d_reference_is_the_tap_sum():
    w, b = RNG.standard_normal((6, 2, 2, 3, 2)).astype(np.float32), RNG.standard_normal(6).astype(np.float32)
    node = Node("Conv3d", "c", [], [], {"stride": [2, 1, 1], "dilation": [1, 2, 1], "pads": [1, 1, 0, 1, 1, 0],
                                        "groups": 2}, {"weight": w, "bias": b})
    ref = conv3d_taps(X5, w, b, (2, 1, 1), (1, 1, 0), (1, 2, 1), 2)
    np.testing.assert_allclose(conv3d_reference(node, [X5])[0], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["max", "avg"])
def test_pool3d_reference_clips_windows_to_the_input(mode):
    node = Node("Pool3d", "p", [], [], {"mode": mode, "kernel": [3, 2, 3], "stride": [2, 2, 2],
                                        "pads": [1, 0, 1, 1, 0, 1], "ceil_mode": True})
    ref = pool3d_loops(X5, 0 if mode == "max" else 1, (3, 2, 3), (2, 2, 2), (1, 0, 1), True)
    np.testing.assert_allclose(pool3d_reference(node, [X5])[0], ref, rtol=1e-6, atol=1e-6)


def test_pool3d_window_over_padding_only_is_a_shape_error():
    node = Node("Pool3d", "p", [], [], {"mode": "max", "kernel": [1, 1, 1], "stride": [1, 1, 1],
                                        "pads": [1, 0, 0, 1, 0, 0]})
    with pytest.raises(ShapeError, match="only padding"):
        pool3d_infer(node, [TensorInfo(X5.shape, X5.dtype)])
