"""TNN's RoiAlign (ONNX opset 10 RoiAlign, as TNN's CPU acc computes it) against a vectorised numpy reference
written from ONNX's definition here: sample grids per bin, bilinear corners clamped to the last row / column,
samples more than a pixel outside counted as 0; average, or the max over samples of the max weighted corner."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.errors import ModelFormatError, UnsupportedOpError
from tests.engine.formats.tnn.test_tnn_lowering import tnn_model

RNG = np.random.default_rng(41)
F32 = np.float32
X = RNG.standard_normal((2, 3, 10, 12)).astype(F32)
ROIS = F32([[1, 1, 9, 7], [0, 0, 23, 19], [-4, -3, 5, 6], [10, 8, 6, 4], [3.3, 2.7, 14.2, 12.9], [20, 20, 30, 30]])
IDX = np.int32([0, 1, 1, 0, 1, 0])
INPUTS = "x 4 2 3 10 12 0 : rois 2 6 4 0 : idx 1 6 3"


def onnx_roi_align(x, rois, idx, mode, oh, ow, ratio, scale):
    h, w = x.shape[2:]
    out = np.zeros((len(rois), x.shape[1], oh, ow))
    for r, (box, b) in enumerate(zip(rois.astype(np.float64) * scale, idx, strict=True)):
        rw, rh = max(box[2] - box[0], 1.0), max(box[3] - box[1], 1.0)
        gh, gw = ratio or math.ceil(rh / oh), ratio or math.ceil(rw / ow)
        ys = box[1] + (np.arange(oh)[:, None] + (np.arange(gh)[None, :] + 0.5) / gh) * rh / oh  # (oh, gh)
        xs = box[0] + (np.arange(ow)[:, None] + (np.arange(gw)[None, :] + 0.5) / gw) * rw / ow  # (ow, gw)

        def taps(v, size):
            inside = (v >= -1) & (v <= size)
            v = np.clip(v, 0, None)
            lo = np.minimum(np.floor(v).astype(int), size - 1)
            frac = np.where(lo >= size - 1, 0.0, v - lo)
            return inside, lo, np.minimum(lo + 1, size - 1), frac

        iny, y0, y1, ly = taps(ys, h)
        inx, x0, x1, lx = taps(xs, w)
        img = x[b].astype(np.float64)  # (C, H, W)
        ya, yb = y0[:, :, None, None], y1[:, :, None, None]
        xa, xb = x0[None, None], x1[None, None]
        lyy, lxx = ly[:, :, None, None], lx[None, None]
        terms = np.stack([(1 - lyy) * (1 - lxx) * img[:, ya, xa], (1 - lyy) * lxx * img[:, ya, xb],
                          lyy * (1 - lxx) * img[:, yb, xa], lyy * lxx * img[:, yb, xb]])  # (4, C, oh, gh, ow, gw)
        terms = terms * (iny[:, :, None, None] & inx[None, None])
        if mode == 1:
            out[r] = terms.sum(axis=0).mean(axis=(2, 4))
        else:
            out[r] = terms.max(axis=(0, 3, 5))
    return out


@pytest.mark.parametrize("mode, oh, ow, ratio, scale", [
    (1, 3, 4, 2, 1.0), (1, 2, 2, 0, 0.5), (0, 3, 3, 2, 1.0), (0, 4, 2, 0, 0.75),
])
def test_roi_align_matches_onnx_opset10(tmp_path, mode, oh, ow, ratio, scale):
    model = tnn_model(tmp_path, INPUTS, [f"RoiAlign ra 3 1 x rois idx y {mode} {oh} {ow} {ratio} {scale}"], "y")
    out = model.instance().run({"x": X, "rois": ROIS, "idx": IDX})["y"]
    np.testing.assert_allclose(out, onnx_roi_align(X, ROIS, IDX, mode, oh, ow, ratio, scale), rtol=1e-5, atol=1e-5)


def test_roi_align_with_a_float_batch_index_is_refused(tmp_path):
    with pytest.raises(UnsupportedOpError) as e:
        tnn_model(tmp_path, "x 4 2 3 10 12 0 : rois 2 6 4 0 : idx 1 6 0",
                  ["ReLU r 1 1 x x1", "RoiAlign odd 3 1 x1 rois idx y 1 2 2 0 1.0"], "y")
    assert "RoiAlign" in str(e.value) and "odd" in str(e.value) and "m.tnnproto:7" in str(e.value)


def test_roi_align_mode_other_than_max_or_average_is_refused(tmp_path):
    with pytest.raises(UnsupportedOpError) as e:
        tnn_model(tmp_path, INPUTS, ["ReLU r 1 1 x x1", "RoiAlign odd 3 1 x1 rois idx y 2 2 2 0 1.0"], "y")
    assert "mode 2" in str(e.value) and "m.tnnproto:7" in str(e.value)


def test_roi_align_without_batch_indices_is_a_format_error(tmp_path):
    with pytest.raises(ModelFormatError) as e:
        tnn_model(tmp_path, INPUTS, ["RoiAlign odd 2 1 x rois y 1 2 2 0 1.0"], "y")
    assert e.value.line == 6 and "batch indices" in str(e.value)
