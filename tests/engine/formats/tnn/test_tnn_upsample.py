"""TNN's float Upsample: the align_corners TNN chooses for -1, the refused "0 0" output size and the constant
scale / size inputs, against a numpy reference written from TNN's x86 float acc (upsample_bilinear2d and
get_bilinear_coeffs in source/tnn/device/x86/acc/x86_upsample_layer_acc.cc), in float32 as it computes."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ModelFormatError
from tests.engine.formats.tnn.test_tnn_lowering import IN4, X4, run1, tnn_model

F32 = np.float32


def _coeffs(n_in: int, n_out: int, align: bool) -> np.ndarray:
    if align:
        r = F32(n_in - 1) / F32(n_out - 1) if n_out > 1 else F32(0)
        return np.array([F32(h) * r for h in range(n_out)], F32)
    r = F32(n_in) / F32(n_out) if n_out > 1 else F32(0)
    c = np.array([F32(float(r) * (h + 0.5) - 0.5) for h in range(n_out)], F32)  # double sum, stored as float
    return np.where(c >= 0, c, F32(0)).astype(F32)


def x86_bilinear(x: np.ndarray, oh: int, ow: int, align: bool) -> np.ndarray:
    """upsample_bilinear2d, one output position at a time (float32 throughout)."""
    _, _, ih, iw = x.shape
    if (ih, iw) == (oh, ow):
        return x.copy()
    hc, wc = _coeffs(ih, oh, align), _coeffs(iw, ow, align)
    y = np.empty(x.shape[:2] + (oh, ow), F32)
    for h2 in range(oh):
        h1 = int(hc[h2])
        h1p = 1 if h1 < ih - 1 else 0
        l1h = F32(hc[h2] - F32(h1))
        l0h = F32(1) - l1h
        for w2 in range(ow):
            w1 = int(wc[w2])
            w1p = 1 if w1 < iw - 1 else 0
            l1w = F32(wc[w2] - F32(w1))
            l0w = F32(1) - l1w
            top = l0w * x[:, :, h1, w1] + l1w * x[:, :, h1, w1 + w1p]
            bottom = l0w * x[:, :, h1 + h1p, w1] + l1w * x[:, :, h1 + h1p, w1 + w1p]
            y[:, :, h2, w2] = l0h * top + l1h * bottom
    return y


def tnn_round(n: int, s: float) -> int:
    return int(np.floor(float(F32(n) * F32(s)) + 0.5))


@pytest.mark.parametrize("params, size, align", [
    ("2 2 2 -1", None, False),           # no size, both scales >= 1: TNN chooses 0
    ("2 1.5 2 -1", None, False),
    ("2 0.5 0.5 -1", None, True),        # a scale below 1: 1
    ("2 2 0.5 -1", None, True),
    ("2 0 0 -1 11 13", (11, 13), True),  # a size given: -1 stays, true as a bool
    ("2 2 2 0", None, False),
    ("2 2 2 1", None, True),
])
def test_upsample_bilinear_align_corners_as_tnn_chooses(tmp_path, params, size, align):
    model = tnn_model(tmp_path, IN4, [f"Upsample u 1 1 x y {params}"], "y")
    sh, sw = (float(v) for v in params.split()[1:3])
    oh, ow = size or (tnn_round(6, sh), tnn_round(8, sw))
    got = run1(model, X4)
    assert got.shape == (1, 4, oh, ow)
    np.testing.assert_allclose(got, x86_bilinear(X4, oh, ow, align), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("params", ["1 2 2 -1", "1 0.5 0.5 -1", "1 0 0 -1 9 10", "1 0.41666666 2 -1"])
def test_upsample_nearest_ignores_align_corners(tmp_path, params):
    """x86's upsample_nearest2d takes align_corners and never reads it: source = trunc(dst * fl(in / out))."""
    model = tnn_model(tmp_path, IN4, [f"Upsample u 1 1 x y {params}"], "y")
    p = params.split()
    oh, ow = (int(p[4]), int(p[5])) if len(p) == 6 else (tnn_round(6, float(p[1])), tnn_round(8, float(p[2])))
    rows = (np.arange(oh, dtype=F32) * (F32(6) / F32(oh))).astype(int)
    cols = (np.arange(ow, dtype=F32) * (F32(8) / F32(ow))).astype(int)
    np.testing.assert_array_equal(run1(model, X4), X4[:, :, rows][..., cols])


@pytest.mark.parametrize("params, words", [
    ("2 2 2 0 0 0", "output size 0x0"),
    ("1 2 2 -1 0 12", "output size 0x12"),
    ("2 0 0 0", "no output size"),
    # TNN's dims and element counts are C ints: a hostile size or scale is refused at load too
    ("2 1000000 1000000 0", "more than 2147483647 elements"),  # 6000000x8000000: a bare MemoryError before
    ("1 1000000 100 0", "more than 2147483647 elements"),
    ("2 0 0 0 3000000000 2", "output size 3000000000x2 (TNN's dims are C ints"),
    ("1 0 0 0 100000 100000", "more than 2147483647 elements"),
])
def test_upsample_size_tnn_refuses_names_file_and_line(tmp_path, params, words):
    with pytest.raises(ModelFormatError) as e:
        tnn_model(tmp_path, IN4, [f"Upsample u 1 1 x y {params}"], "y")
    assert "m.tnnproto" in str(e.value) and ":6" in str(e.value) and words in str(e.value)


def test_upsample_constant_scales_input_replaces_the_params(tmp_path):
    """Two inputs: the second holds scales (FillLayerParamWithConstantResource), not a size; -1 then chosen from
    them (0: both >= 1)."""
    consts = [("sc", F32([1, 1, 2, 1.5]))]
    model = tnn_model(tmp_path, IN4, ["Upsample u 2 1 x sc y 2 1 1 -1"], "y", consts=consts)
    np.testing.assert_allclose(run1(model, X4), x86_bilinear(X4, 12, 12, False), rtol=1e-6, atol=1e-6)


def test_upsample_constant_sizes_input_is_the_fourth(tmp_path):
    consts = [("r", F32([0])), ("sc", F32([0])), ("sz", np.array([1, 4, 9, 5], np.int32))]
    model = tnn_model(tmp_path, IN4, ["Upsample u 4 1 x r sc sz y 2 1 1 -1"], "y", consts=consts)
    np.testing.assert_allclose(run1(model, X4), x86_bilinear(X4, 9, 5, True), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["1", "2"])
def test_upsample_size_rounds_the_float32_product(tmp_path, mode):
    """6 x 0.41666666f is 2.5 in float32 (2.4999999 in float64): TNN's int(round(h * scale)) gives 3 rows."""
    model = tnn_model(tmp_path, IN4, [f"Upsample u 1 1 x y {mode} 0.41666666 1 0"], "y")
    assert run1(model, X4).shape == (1, 4, 3, 8)
