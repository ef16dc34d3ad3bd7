"""TNN's Convolution3D and Pooling3D (NCDHW) against numpy references written as TNN's naive loops do it (sums
over kernel taps; pooling windows clipped to the input), and the load-time refusals of what they leave out."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ModelFormatError, UnsupportedOpError
from tests.engine.formats.tnn.test_tnn_lowering import run1, tnn_model

RNG = np.random.default_rng(31)
F32 = np.float32
X5 = RNG.standard_normal((2, 4, 5, 6, 7)).astype(F32)
IN5 = "x 5 2 4 5 6 7 0"


def conv3d_taps(x, w, b, stride, pads, dil, groups):
    """Sum over the kernel taps of strided views of the zero-padded input (float64)."""
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(p, p) for p in pads])
    o, cg, kd, kh, kw = w.shape
    out = [(xp.shape[2 + a] - dil[a] * (w.shape[2 + a] - 1) - 1) // stride[a] + 1 for a in range(3)]
    og = o // groups
    y = np.zeros((x.shape[0], o, *out))
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        for i in range(kd):
            for j in range(kh):
                for k in range(kw):
                    d0, h0, w0 = i * dil[0], j * dil[1], k * dil[2]
                    part = xs[:, :, d0:d0 + stride[0] * (out[0] - 1) + 1:stride[0],
                              h0:h0 + stride[1] * (out[1] - 1) + 1:stride[1],
                              w0:w0 + stride[2] * (out[2] - 1) + 1:stride[2]]
                    y[:, g * og:(g + 1) * og] += np.einsum("ncdhw,oc->nodhw", part, w[g * og:(g + 1) * og, :, i, j, k])
    return y + (0 if b is None else b.reshape(1, -1, 1, 1, 1))


@pytest.mark.parametrize("groups, stride, pads, dil, act", [
    (1, (1, 1, 1), (1, 1, 1), (1, 1, 1), 0),
    (2, (2, 1, 2), (0, 1, 2), (1, 2, 1), 1),
    (4, (1, 2, 1), (1, 0, 1), (2, 1, 1), 2),
    (1, (2, 2, 2), (1, 1, 1), (1, 1, 1), 256),
])
def test_conv3d_matches_the_tap_sum(tmp_path, groups, stride, pads, dil, act):
    oc, k = 8, (3, 2, 3)
    w = RNG.standard_normal((oc, 4 // groups, *k)).astype(F32)
    b = RNG.standard_normal(oc).astype(F32)
    args = " ".join(map(str, [groups, 4 // groups, oc, *k, *stride, *pads, 1, -1, *dil, act]))
    model = tnn_model(tmp_path, IN5, [f"Convolution3D c 1 1 x y {args}"], "y",
                      [("Convolution3D", "c", ["c", 1, w, b])])
    ref = conv3d_taps(X5, w, b, stride, pads, dil, groups)
    ref = {0: ref, 1: np.maximum(ref, 0), 2: np.clip(ref, 0, 6), 256: ref / (1 + np.exp(-ref))}[act]
    np.testing.assert_allclose(run1(model, X5), ref, rtol=1e-4, atol=1e-4)


def pool3d_loops(x, mode, k, s, p, ceil):
    out = []
    for a in range(3):
        span = x.shape[2 + a] + 2 * p[a] - k[a]
        out.append((-(-span // s[a]) if ceil else span // s[a]) + 1)
    y = np.zeros((*x.shape[:2], *out))
    for d in range(out[0]):
        for h in range(out[1]):
            for w in range(out[2]):
                lo = [d * s[0] - p[0], h * s[1] - p[1], w * s[2] - p[2]]
                hi = [min(lo[a] + k[a], x.shape[2 + a]) for a in range(3)]
                lo = [max(v, 0) for v in lo]
                win = x[:, :, lo[0]:hi[0], lo[1]:hi[1], lo[2]:hi[2]].astype(np.float64)
                count = (hi[0] - lo[0]) * (hi[1] - lo[1]) * (hi[2] - lo[2])
                y[:, :, d, h, w] = win.max(axis=(2, 3, 4)) if mode == 0 else win.sum(axis=(2, 3, 4)) / count
    return y


@pytest.mark.parametrize("mode, k, s, p, ceil, kidx", [
    (0, (2, 2, 2), (2, 2, 2), (0, 0, 0), 0, ""),
    (1, (3, 3, 3), (2, 2, 2), (1, 1, 1), 0, "-1 -1 -1 "),
    (1, (3, 3, 2), (2, 2, 3), (1, 1, 0), 1, ""),
    (0, (3, 2, 3), (2, 2, 2), (1, 0, 1), 1, "-1 -1 -1 "),
])
def test_pool3d_matches_tnns_clipped_windows(tmp_path, mode, k, s, p, ceil, kidx):
    args = " ".join(map(str, [mode, *k, *s, *p])) + f" {kidx}-1 {ceil}"
    model = tnn_model(tmp_path, IN5, [f"Pooling3D pl 1 1 x y {args}"], "y")
    np.testing.assert_allclose(run1(model, X5), pool3d_loops(X5, mode, k, s, p, ceil), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layer, words", [
    ("Convolution3D odd 1 1 x1 y 1 4 6 3 3 3 1 1 1 1 1 1 0 0 1 1 1 0", "pad_type 0"),
    ("Convolution3D odd 1 1 x1 y 1 4 6 3 3 3 1 1 1 1 1 1 0 -1 1 1 1 3", "activation type 3"),
    ("Pooling3D odd 1 1 x1 y 0 2 2 2 2 2 2 0 0 0 0 0", "pad_type 0"),
    ("Pooling3D odd 1 1 x1 y 0 2 2 2 2 2 2 0 0 0 1 -1 -1 -1 0", "kernel sizes taken from input dims"),
    ("Pooling3D odd 1 1 x1 y 2 2 2 2 2 2 2 0 0 0 -1 0", "pool_type 2"),
    ("Deconvolution3D odd 1 1 x1 y 1 4 6 3 3 3 1 1 1 1 1 1 0 -1", "cannot load it"),
])
def test_volume_variants_left_out_are_refused_with_file_and_line(tmp_path, layer, words):
    res = [("Convolution3D", "odd", ["odd", 0, np.zeros((6, 4, 3, 3, 3), F32)])] if "Conv" in layer else []
    with pytest.raises(UnsupportedOpError) as e:
        tnn_model(tmp_path, IN5, ["ReLU r 1 1 x x1", layer], "y", res)
    assert layer.split()[0] in str(e.value) and "odd" in str(e.value) and "m.tnnproto:7" in str(e.value)
    assert words in str(e.value)


def test_pool3d_whose_last_window_covers_only_padding_is_refused(tmp_path):
    """D = 5, kernel 2, stride 2, pad 1, ceil: the 4th window starts at 5, past the input (TNN: 0 or 0/0)."""
    with pytest.raises(UnsupportedOpError) as e:
        tnn_model(tmp_path, IN5, ["ReLU r 1 1 x x1", "Pooling3D odd 1 1 x1 y 1 2 1 1 2 1 1 1 0 0 -1 1"], "y")
    assert "only padding" in str(e.value) and "m.tnnproto:7" in str(e.value)


def test_conv3d_filter_of_the_wrong_size_is_a_format_error(tmp_path):
    with pytest.raises(ModelFormatError) as e:
        tnn_model(tmp_path, IN5, ["Convolution3D odd 1 1 x y 1 4 6 3 3 3 1 1 1 1 1 1 0 -1 1 1 1 0"], "y",
                  [("Convolution3D", "odd", ["odd", 0, np.zeros((6, 4, 3, 3), F32)])])
    assert e.value.line == 6 and "filter" in str(e.value)
