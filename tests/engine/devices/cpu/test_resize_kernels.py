"""Resize, PixelShuffle, ChannelShuffle CPU kernels vs the references, threads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import check_kernel, cpu_device, infer, load_cases, make_node, reference

from engine.devices.cpu import resize as R
from engine.devices.cpu import threads as _threads
from engine.errors import ShapeError
from engine.ops.registry import TensorInfo, get_op
from engine.ops.resize import taps

OPS = {"Resize", "PixelShuffle", "ChannelShuffle"}
GOLDENS = Path(__file__).resolve().parents[3] / "fixtures" / "ops" / "spatial.npz"
CASES = load_cases(GOLDENS, OPS)
RNG = np.random.default_rng(11)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernel_matches_reference(case):
    check_kernel(case.node(), case.inputs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("params", [{"mode": "nearest", "scale": [2, 2]}, {"mode": "bilinear", "scale": [1.5, 0.5]},
                                    {"mode": "nearest_exact", "scale": [1.5, 0.7]},
                                    {"mode": "bicubic", "scale": [2, 3], "align_corners": True},
                                    {"mode": "bilinear", "scale": [2, 2], "coordinate": "tnn"}])
def test_kernel_built_at_max_runs_smaller(params):
    node = make_node("Resize", 1, params=params)
    check_kernel(node, [rand(1, 3, 5, 4)], [rand(2, 3, 9, 8)])
    check_kernel(node, [rand(2, 3, 9, 8)])


def test_size_input_overrides_params_and_drives_scale():
    node = make_node("Resize", 2, params={"mode": "bilinear", "scale": [3, 3]})
    x, size = rand(1, 2, 4, 6), np.array([1, 2, 7, 5], np.int64)
    assert infer(node, [x, size], values=True)[0].shape == (1, 2, 7, 5)
    same = make_node("Resize", 1, params={"mode": "bilinear", "size": [7, 5]})
    np.testing.assert_array_equal(reference(node, [x, size])[0], reference(same, [x])[0])
    check_kernel(node, [x, size])
    unknown = [TensorInfo(x.shape, x.dtype), TensorInfo(size.shape, size.dtype)]
    with pytest.raises(ShapeError, match="not known"):
        get_op("Resize").infer(node, unknown)


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


@pytest.mark.parametrize("mode,align,size", [("nearest", False, (7, 11)), ("nearest", False, (3, 2)),
                                             ("bilinear", False, (9, 13)), ("bilinear", False, (1, 3)),
                                             ("bilinear", True, (9, 4)), ("bilinear", True, (1, 1))])
def test_tnn_coordinate_matches_tnn_loops(mode, align, size):
    x = rand(1, 2, 5, 6)
    node = make_node("Resize", 1, params={"mode": mode, "align_corners": align, "size": list(size),
                                          "coordinate": "tnn"})
    np.testing.assert_allclose(reference(node, [x])[0], tnn_upsample(x, *size, mode, align), rtol=1e-5, atol=1e-6)
    check_kernel(node, [x])


@pytest.mark.parametrize("op,params,shape", [("PixelShuffle", {"upscale": 2}, (2, 8, 3, 5)),
                                             ("ChannelShuffle", {"groups": 4}, (2, 8, 3, 5))])
def test_shuffles_below_max_shape(op, params, shape):
    node = make_node(op, 1, params=params)
    check_kernel(node, [rand(1, 8, 2, 3)], [rand(*shape)])


@pytest.mark.parametrize("r", [2, 3])
def test_pixel_unshuffle_at_and_below_max_shape(r):
    node = make_node("PixelUnshuffle", 1, params={"downscale": r})
    check_kernel(node, [rand(2, 3, 4 * r, 2 * r)])
    check_kernel(node, [rand(1, 3, 2 * r, r)], [rand(2, 3, 4 * r, 2 * r)])


@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic"])
def test_kernel_split_over_threads(monkeypatch, mode):
    before = _threads.get_threads()
    monkeypatch.setattr(_threads, "MIN_WORK", 0)
    _threads.set_threads(3)
    try:
        check_kernel(make_node("Resize", 1, params={"mode": mode, "size": [11, 7]}), [rand(2, 5, 6, 4)])
    finally:
        _threads.set_threads(before)


def torch_bilinear_2x(x: np.ndarray) -> np.ndarray:
    """torch's upsample_bilinear2d by 2, align_corners=False, written out in float64: source coordinate
    (o + 0.5) / 2 - 0.5 clamped below at 0, the upper neighbour clamped to the last pixel."""
    def axis(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        src = np.maximum((np.arange(2 * n) + 0.5) / 2 - 0.5, 0)
        i0 = np.floor(src).astype(int)
        return i0, np.minimum(i0 + 1, n - 1), src - i0
    y0, y1, ly = axis(x.shape[2])
    x0, x1, lx = axis(x.shape[3])
    x = x.astype(np.float64)
    rows = x[:, :, y0] * (1 - ly)[:, None] + x[:, :, y1] * ly[:, None]
    return rows[..., x0] * (1 - lx) + rows[..., x1] * lx


@pytest.mark.parametrize("shape", [(1, 1024, 7, 7), (2, 3, 1, 1), (1, 5, 1, 6), (1, 7, 5, 1), (1, 2, 2, 3),
                                   (1, 300, 3, 9), (2, 4, 33, 17), (1, 2, 40, 41), (1, 4, 130, 130)])
def test_bilinear_2x_vector_passes(shape):
    """Bilinear upsampling by 2 takes the vector passes (RK.bilinear_2x; the last shape split over the pool): torch's
    sums, and the reference's."""
    node = make_node("Resize", 1, params={"mode": "bilinear", "scale": [2, 2], "align_corners": False})
    for axis, n in ((0, shape[2]), (1, shape[3])):
        assert R._is_bilinear_2x(*taps(node, axis, n, 2 * n, False), n)
    x = rand(*shape)
    check_kernel(node, [x])
    np.testing.assert_allclose(reference(node, [x])[0], torch_bilinear_2x(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("params", [{"mode": "bilinear", "scale": [2, 2], "align_corners": True},
                                    {"mode": "bilinear", "scale": [3, 3]}, {"mode": "bicubic", "scale": [2, 2]},
                                    {"mode": "nearest", "scale": [2, 2]}])
def test_other_taps_keep_the_gather(params):
    node = make_node("Resize", 1, params=params)
    n = 6
    out = int(n * params["scale"][0])
    assert not R._is_bilinear_2x(*taps(node, 0, n, out, False), n)
    check_kernel(node, [rand(1, 3, n, n)])


@pytest.mark.parametrize("scale,shape", [([2, 2], (1, 256, 20, 20)), ([3, 3], (2, 3, 5, 7)), ([2, 1], (1, 4, 6, 9)),
                                         ([1, 4], (1, 2, 3, 5)), ([2, 2], (1, 3, 1, 1))])
def test_nearest_by_whole_factors_runs_as_copies(scale, shape, monkeypatch):
    """Nearest taps that repeat each input k times (output i reads input i // k) run RK.nearest_repeat, exact."""
    node = make_node("Resize", 1, params={"mode": "nearest", "scale": scale})
    x = rand(*shape)
    for axis, n, k in ((0, shape[2], scale[0]), (1, shape[3], scale[1])):
        assert R._repeat_factor(*taps(node, axis, n, k * n, False), n) == k
    calls = []
    real = R.RK.nearest_repeat
    monkeypatch.setattr(R.RK, "nearest_repeat", lambda *a: (calls.append(a[2:4]), real(*a))[1])
    check_kernel(node, [x], rtol=0, atol=0)
    np.testing.assert_array_equal(reference(node, [x])[0], np.repeat(np.repeat(x, scale[0], 2), scale[1], 3))
    assert calls and calls[0] == tuple(scale)


@pytest.mark.parametrize("threads", [2, 3])
def test_nearest_copies_split_by_input_rows(monkeypatch, threads):
    """The copies split over threads by input rows (an image's 3 planes split evenly): every split exact."""
    before = _threads.get_threads()
    monkeypatch.setattr(_threads, "MIN_WORK", 0)
    _threads.set_threads(threads)
    try:
        node = make_node("Resize", 1, params={"mode": "nearest", "scale": [2, 3]})
        x = rand(2, 3, 9, 7)
        check_kernel(node, [x], rtol=0, atol=0)
        np.testing.assert_array_equal(reference(node, [x])[0], np.repeat(np.repeat(x, 2, 2), 3, 3))
    finally:
        _threads.set_threads(before)


@pytest.mark.parametrize("params,n,out", [({"mode": "nearest", "scale": [1.5, 1.5]}, 6, 9),
                                          ({"mode": "bilinear", "scale": [2, 2]}, 6, 12),
                                          ({"mode": "nearest", "scale": [0.5, 0.5]}, 6, 3)])
def test_other_taps_are_not_repeats(params, n, out):
    node = make_node("Resize", 1, params=params)
    assert R._repeat_factor(*taps(node, 0, n, out, False), n) == 0
    check_kernel(node, [rand(1, 3, n, n)])


def _on_openmp_team() -> bool:
    cpu_device()
    return _threads.pool_kind(_threads.get_policy(), _threads._openmp is not None) == "openmp"


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("params,shape", [
    ({"mode": "bilinear", "scale": [2, 2], "align_corners": False}, (1, 1024, 7, 7)),
    ({"mode": "bilinear", "scale": [2, 2], "align_corners": False}, (2, 5, 33, 17)),
    ({"mode": "bilinear", "scale": [2, 2], "align_corners": False}, (1, 1, 3, 1)),  # fewer planes than threads
    ({"mode": "nearest", "scale": [2, 2]}, (1, 256, 20, 20)),
    ({"mode": "nearest", "scale": [3, 2]}, (2, 3, 9, 7)),
])
def test_native_region_splits_match_the_reference(params, shape, threads, monkeypatch):
    """The bilinear passes and the nearest copies split as one native region (R._native) wherever OpenMP's team runs
    our kernels: every output written (the output starts as NaN), equal to the reference (nearest exactly)."""
    if not _on_openmp_team():
        pytest.skip("our kernels do not run on OpenMP's team here (no oneDNN, or the `short` wait policy)")
    before = _threads.get_threads()
    _threads.set_threads(threads)
    runs = []
    real = R.run_native
    monkeypatch.setattr(R, "run_native", lambda fn, data: (runs.append(real(fn, data)), runs[-1])[1])
    monkeypatch.setattr(R, "native_regions", lambda: True)
    monkeypatch.setattr(R, "NATIVE_RESIZE_OUTPUTS", 0)
    try:
        node = make_node("Resize", 1, params=params)
        x = rand(*shape)
        exact = params["mode"] == "nearest"
        check_kernel(node, [x], rtol=0 if exact else 1e-5, atol=0 if exact else 1e-6)
        if not exact:
            np.testing.assert_allclose(reference(node, [x])[0], torch_bilinear_2x(x), rtol=1e-6, atol=1e-6)
        assert runs and all(runs)
    finally:
        _threads.set_threads(before)


def test_native_region_declines_small_or_odd_arrays(monkeypatch):
    """Under NATIVE_RESIZE_OUTPUTS, on one thread, or on arrays that are not float32 C-contiguous (items, h, w) of the
    kernel's output shape, R._native runs nothing and says so."""
    monkeypatch.setattr(R, "native_regions", lambda: True)
    monkeypatch.setattr(R, "run_native", lambda fn, data: pytest.fail("no region expected"))
    x = rand(4, 8, 8)
    assert not R._native(R.RK.RESIZE_BILINEAR_2X, x, np.empty((4, 16, 16), np.float32))  # 1024 outputs: small
    monkeypatch.setattr(R, "NATIVE_RESIZE_OUTPUTS", 0)
    assert not R._native(R.RK.RESIZE_BILINEAR_2X, x, np.empty((4, 16, 15), np.float32))
    assert not R._native(R.RK.RESIZE_BILINEAR_2X, x[:, ::2], np.empty((4, 8, 16), np.float32))
    assert not R._native(R.RK.RESIZE_NEAREST, x.astype(np.float64), np.empty((4, 24, 16)), 3, 2)
    monkeypatch.setattr(R, "get_threads", lambda: 1)
    assert not R._native(R.RK.RESIZE_BILINEAR_2X, x, np.empty((4, 16, 16), np.float32))
