"""Resize, PixelShuffle, ChannelShuffle: references vs PyTorch goldens, TNN's rounding, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_golden, infer, load_cases, make_node, reference

from engine.errors import ShapeError, UnsupportedOpError

OPS = {"Resize", "PixelShuffle", "ChannelShuffle"}
GOLDENS = Path(__file__).resolve().parents[2] / "fixtures" / "ops" / "spatial.npz"
CASES = load_cases(GOLDENS, OPS)
RNG = np.random.default_rng(11)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_goldens_cover_every_mode():
    modes = {(c.params["mode"], c.params["align_corners"], "size" in c.params) for c in CASES if c.op == "Resize"}
    assert modes >= {(m, a, s) for m in ("bilinear", "bicubic") for a in (False, True) for s in (True,)}
    assert {("nearest", False, True), ("nearest", False, False), ("bilinear", False, False)} <= modes
    assert {("nearest-exact", False, True), ("nearest-exact", False, False)} <= modes
    assert {c.op for c in CASES} == OPS


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reference_matches_torch(case):
    check_golden(case, rtol=1e-5, atol=1e-5)


def tnn_upsample(x: np.ndarray, oh: int, ow: int, mode: str, align: bool) -> np.ndarray:
    """A line-by-line transcription of TNN's CPU upsample loops (float32 scales, int truncation)."""
    ih, iw = x.shape[2:]
    out = np.zeros(x.shape[:2] + (oh, ow), np.float64)
    f32 = np.float32
    if mode == "nearest":
        hs, ws = f32(ih) / f32(oh), f32(iw) / f32(ow)
        for j in range(oh):
            for u in range(ow):
                out[:, :, j, u] = x[:, :, int(f32(j) * hs), int(f32(u) * ws)]
        return out
    if align:
        rh = f32(ih - 1) / f32(oh - 1) if oh > 1 else f32(0)
        rw = f32(iw - 1) / f32(ow - 1) if ow > 1 else f32(0)
    else:
        rh = f32(ih) / f32(oh) if oh > 1 else f32(0)
        rw = f32(iw) / f32(ow) if ow > 1 else f32(0)

    def src(r, d):
        v = f32(r * d) if align else f32(float(r) * (d + 0.5) - 0.5)
        return max(v, f32(0))
    for h2 in range(oh):
        h1r = src(rh, h2)
        h1 = int(h1r)
        h1p = 1 if h1 < ih - 1 else 0
        hl = h1r - h1
        for w2 in range(ow):
            w1r = src(rw, w2)
            w1 = int(w1r)
            w1p = 1 if w1 < iw - 1 else 0
            wl = w1r - w1
            out[:, :, h2, w2] = ((1 - hl) * ((1 - wl) * x[:, :, h1, w1] + wl * x[:, :, h1, w1 + w1p])
                                 + hl * ((1 - wl) * x[:, :, h1 + h1p, w1] + wl * x[:, :, h1 + h1p, w1 + w1p]))
    return out


def test_tnn_coordinate_rounds_the_size_and_ignores_the_scale_for_coordinates():
    x = rand(1, 1, 3, 5)
    node = make_node("Resize", 1, params={"mode": "nearest", "scale": [1.5, 1.7], "coordinate": "tnn"})
    y = reference(node, [x])[0]
    assert y.shape == (1, 1, 5, 9)  # round(4.5) = 5, round(8.5) = 9; torch would floor to (4, 8)
    np.testing.assert_array_equal(y, tnn_upsample(x, 5, 9, "nearest", False).astype(np.float32))


@pytest.mark.parametrize("op,params,shape,match", [
    ("Resize", {"mode": "nearest"}, (1, 1, 4, 4), "neither"),
    ("Resize", {"mode": "nearest", "scale": [0.1, 1]}, (1, 1, 4, 4), "positive"),
    ("Resize", {"mode": "nearest", "size": [2, 2]}, (4, 4), "NCHW"),
    ("PixelShuffle", {"upscale": 2}, (1, 6, 2, 2), "does not divide"),
    ("ChannelShuffle", {"groups": 4}, (1, 6, 2, 2), "does not divide"),
    ("ChannelShuffle", {}, (1, 6, 2, 2), "groups=0"),
    ("PixelUnshuffle", {"downscale": 2}, (1, 6, 4, 3), "does not divide"),
    ("PixelUnshuffle", {}, (1, 6, 4, 4), "downscale=0"),
    ("PixelUnshuffle", {"downscale": 2}, (6, 4, 4), "NCHW"),
])
def test_errors_name_the_node(op, params, shape, match):
    with pytest.raises(ShapeError, match=match) as err:
        infer(make_node(op, 1, params=params), [np.zeros(shape, np.float32)])
    assert "test:1" in str(err.value)


def test_unknown_mode_is_unsupported():
    with pytest.raises(UnsupportedOpError, match="area"):
        infer(make_node("Resize", 1, params={"mode": "area", "size": [3, 3]}), [rand(1, 1, 4, 4)])


@pytest.mark.parametrize("r,shape", [(2, (2, 3, 4, 6)), (3, (1, 2, 6, 3)), (1, (1, 2, 3, 4))])
def test_pixel_unshuffle_reference_is_torchs_index_rule(r, shape):
    """out[n, c*r*r + dh*r + dw, h, w] = x[n, c, h*r + dh, w*r + dw] (torch.pixel_unshuffle), element by element;
    and PixelShuffle undoes it."""
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    (y,) = reference(make_node("PixelUnshuffle", 1, params={"downscale": r}), [x])
    n, c, h, w = shape
    want = np.empty((n, c * r * r, h // r, w // r), np.float32)
    for ci, dh, dw in np.ndindex(c, r, r):
        want[:, ci * r * r + dh * r + dw] = x[:, ci, dh::r, dw::r]
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(reference(make_node("PixelShuffle", 1, params={"upscale": r}), [y])[0], x)
