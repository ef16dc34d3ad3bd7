"""ConvBlocked's Winograd F(4x4, 3x3) path against Conv's numpy float64 reference: pads, sizes off the 4x4 tile,
residuals, every epilogue, batches that switch between Winograd and the direct kernel on one workspace, chunks
with a remainder, the convs it must leave alone, and the option that turns it off. Every case runs with the
vector transforms (winograd_simd.py) as one parallel region (winograd_blocked_region.py) and in chunks of three
steps, and with the scalar numba kernels."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import cpu_device
from test_conv_blocked import make, run_case

from engine.devices.cpu.conv import winograd_blocked as W
from engine.devices.cpu.onednn import objects as onednn
from engine.ops.conv_geometry import conv_geom

if not onednn.available():
    pytest.skip("oneDNN (libdnnl.so.3 from the onednn-cpu-gomp wheel) is not installed", allow_module_level=True)

WINO = "winograd"
C = 96


@pytest.fixture(autouse=True, params=["vector", "chunks", "scalar"])
def transforms(request, monkeypatch):
    """Both transform kernels, the vector ones as one region and in chunks; the work floor is lowered so tile
    counts alone decide in these small cases, and the rule for AVX-512's 16-lane blocks (big convs only, no
    F(2x2)) is off so both tile sizes run on any block."""
    monkeypatch.setattr(W, "VECTOR_TRANSFORMS", request.param != "scalar")
    monkeypatch.setattr(W, "REGION", request.param == "vector")
    monkeypatch.setattr(W, "MIN_WORK", C * C * W.MIN_TILES)
    monkeypatch.setattr(W, "WIDE_BLOCK", 1 << 30)
    return request.param


@pytest.mark.parametrize("act,act_params", [(None, None), ("relu", None), ("relu6", None),
                                            ("leaky_relu", {"alpha": 0.1}), ("clip", {"min": -0.3, "max": 0.4}),
                                            ("silu", None)])
@pytest.mark.parametrize("residual", [False, True])
def test_matches_reference_with_every_epilogue(act, act_params, residual):
    node, plain = make(C, C, 3, act=act, act_params=act_params)
    # 9x9: 3x3 tiles whose last row and column are clipped; batch 2 has 18 tiles (Winograd), batch 1 has 9
    # (below W.MIN_TILES: the direct kernel on the same workspace), then Winograd again
    run_case(node, plain, [(2, C, 9, 9), (1, C, 9, 9), (2, C, 9, 9)], residual=residual, impl=WINO)


def test_valid_convolution_without_padding():
    node, plain = make(C, 2 * C, 3)
    node.params["pads"] = plain.params["pads"] = (0, 0, 0, 0)
    run_case(node, plain, [(1, C, 26, 18)], residual=False, impl=WINO)  # 24x16 out: 6x4 tiles


def test_chunks_with_a_remainder(monkeypatch):
    monkeypatch.setattr(W, "CHUNK_BYTES", 1)  # chunks of 32 tiles: 3 images of 25 tiles = 32 + 32 + 11
    node, plain = make(C, C, 3, act="relu")
    geo = conv_geom(plain, (3, C, 20, 20))
    assert W.chunk_tiles(geo) == 32 and geo.n * 25 == 75
    run_case(node, plain, [(3, C, 20, 20), (2, C, 20, 20)], residual=True, impl=WINO)


@pytest.mark.parametrize("kwargs,shape", [
    ({"c": C, "o": C, "k": 3, "stride": 2}, (2, C, 16, 16)),
    ({"c": 2 * C, "o": 2 * C, "k": 3, "groups": 2}, (2, 2 * C, 12, 12)),
    ({"c": C, "o": C, "k": 3, "dilation": 2}, (2, C, 12, 12)),
    ({"c": C, "o": C, "k": 3, "dst_blocked": False}, (2, C, 12, 12)),
    ({"c": 64, "o": 64, "k": 3}, (1, 64, 16, 16)),  # too little work to pay (64 * 64 * 16 < SMALL_WORK)
    ({"c": 16, "o": 128, "k": 3}, (8, 16, 32, 32)),  # too narrow an input
    ({"c": C, "o": C, "k": 1}, (2, C, 16, 16)),
])
def test_other_convs_stay_on_the_direct_kernel(kwargs, shape):
    node, plain = make(**kwargs)
    run_case(node, plain, [shape], residual=False)


def test_switched_off_by_the_option():
    """CpuOptions(winograd=False) (NNSERVE_WINOGRAD=0) keeps an eligible conv on oneDNN's direct kernel."""
    node, plain = make(C, C, 3, act="relu")
    run_case(node, plain, [(2, C, 12, 12)], residual=False, device=cpu_device(winograd=False))


def test_weight_transform_gives_the_direct_conv_on_one_tile():
    """A^T [U * (B^T d B)] A of one 6x6 patch is the 4x4 valid correlation (the matrices of the kernel file)."""
    rng = np.random.default_rng(2)
    g, d = rng.standard_normal((3, 3)), rng.standard_normal((6, 6))
    bt = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
                   [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], float)
    at = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], float)
    u = W.transform_weights(g[None, None].astype(np.float32))[:, 0, 0].reshape(6, 6)
    got = at @ (u * (bt @ d @ bt.T)) @ at.T
    want = np.array([[(d[i:i + 3, j:j + 3] * g).sum() for j in range(4)] for i in range(4)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("c,o,hw,batch,want", [
    (64, 64, 56, 1, 4), (128, 128, 28, 1, 4), (256, 256, 14, 1, 4),  # ResNet-18's stages at batch 1
    (512, 512, 7, 1, 2), (512, 512, 7, 8, 4),  # 4 F(4x4) tiles at batch 1 (F(2x2) has 16), 32 at batch 8
    (16, 64, 55, 8, None), (32, 128, 27, 8, 4), (48, 192, 13, 8, 4),  # SqueezeNet's expand3x3 at b8
    (32, 128, 27, 1, 4), (64, 256, 13, 1, 4),  # ... and at b1 (W.SMALL_WORK: 200K and 262K)
    (96, 48, 32, 1, 4), (48, 48, 32, 1, 4), (64, 64, 16, 1, None), (32, 32, 32, 1, None),  # MobileViT-like, 65K
])
def test_rule_picks_the_faster_path_measured_in_bench(monkeypatch, c, o, hw, batch, want):
    """W.choose against the measured tables (the module's docs; the thresholds' source), at the module's own
    floor."""
    monkeypatch.undo()
    node, plain = make(c, o, 3)
    geo = conv_geom(plain, (batch, c, hw, hw))
    assert W.choose(geo, 8) == want
    if want == 2:  # F(2x2) has vector transforms only
        monkeypatch.setattr(W, "VECTOR_TRANSFORMS", False)
        assert W.choose(geo, 8) is None
        monkeypatch.undo()
        assert W.choose(geo, 4) is None


@pytest.mark.parametrize("c,o,hw,threads,want", [
    (96, 48, 32, 2, 4), (96, 96, 20, 2, 4), (40, 40, 28, 2, 4),  # under MIN_WORK, 32, 12 and 24 tiles a thread
    (128, 64, 16, 2, None), (64, 256, 13, 2, None), (128, 64, 16, 1, 4),  # 16 tiles: 8 a thread on two
    (256, 256, 14, 2, 4),  # MIN_WORK and more: whatever the tiles per thread
])
def test_rule_below_min_work_wants_tiles_for_every_thread(monkeypatch, c, o, hw, threads, want):
    """Between SMALL_WORK and MIN_WORK, F(4x4) only with SPLIT_TILES tiles a thread (8-lane blocks, batch 1)."""
    monkeypatch.undo()
    node, plain = make(c, o, 3)
    geo = conv_geom(plain, (1, c, hw, hw))
    assert W.choose(geo, 8, threads) == want


@pytest.mark.parametrize("c,o,hw,batch,threads,want", [
    (64, 64, 56, 1, 2, 4), (128, 128, 28, 1, 2, 4),  # ResNet-18 b1, 2 threads: 98 and 24 tiles a thread
    (256, 256, 14, 1, 2, None), (512, 512, 7, 1, 2, None),  # 8 and 2 tiles a thread: U's reads bound them
    (64, 64, 56, 1, 1, 4), (256, 256, 14, 1, 1, 4), (512, 512, 7, 1, 1, None),  # one thread (4 tiles: direct)
    (64, 64, 56, 8, 2, 4), (512, 512, 7, 8, 2, 4), (64, 64, 224, 1, 2, 4),  # ResNet-18 b8, VGG's 64ch@224
    (48, 192, 13, 8, 2, 4),  # SqueezeNet's fire6 at b8: 112M multiply-adds, 64 tiles a thread
    (32, 128, 13, 2, 2, None),  # 30M multiply-adds: under WIDE_MIN_MACS
    (32, 32, 52, 3, 2, None),  # 75M multiply-adds but under MIN_WORK: SMALL_WORK is the 8-lane rule only
])
def test_rule_on_avx512_blocks_takes_winograd_only_for_big_convs(monkeypatch, c, o, hw, batch, threads, want):
    """16-lane blocks (oneDNN's AVX-512 kernels): F(4x4) from WIDE_MIN_MACS multiply-adds and WIDE_MIN_TILES
    tiles a thread, F(2x2) never."""
    monkeypatch.undo()
    node, plain = make(c, o, 3)
    geo = conv_geom(plain, (batch, c, hw, hw))
    assert W.choose(geo, 16, threads) == want


SMALL = 256  # F(2x2) takes maps too small for F(4x4) at W.SMALL_MIN_CHANNELS channels


@pytest.mark.parametrize("act,act_params", [(None, None), ("relu", None), ("leaky_relu", {"alpha": 0.1}),
                                            ("clip", {"min": -0.3, "max": 0.4}), ("silu", None)])
@pytest.mark.parametrize("residual", [False, True])
def test_small_maps_run_f2x2(transforms, act, act_params, residual):
    """7x7 at batch 1: 4 F(4x4) tiles, so F(2x2)'s 16 (the last row and column clipped); the scalar kernels have
    no F(2x2), so without the vector transforms the direct kernel runs it."""
    node, plain = make(SMALL, SMALL, 3, act=act, act_params=act_params)
    impl = "winograd-f2x2" if transforms != "scalar" else "onednn:"
    run_case(node, plain, [(1, SMALL, 7, 7)], residual=residual, impl=impl)


def test_f2x2_chunks_with_a_remainder(transforms, monkeypatch):
    monkeypatch.setattr(W, "CHUNK_BYTES", 1)  # chunks of 32 tiles: 11x11 has 6x6 = 36 = 32 + 4
    node, plain = make(SMALL, SMALL, 3, act="relu")
    geo = conv_geom(plain, (1, SMALL, 11, 11))
    assert W.chunk_tiles(geo, 2) == 32 and W.tiles(geo, 2) == (6, 6)
    impl = "winograd-f2x2" if transforms != "scalar" else "onednn:"
    run_case(node, plain, [(1, SMALL, 11, 11)], residual=True, impl=impl)


def test_f2x2_weight_transform_gives_the_direct_conv_on_one_tile():
    rng = np.random.default_rng(3)
    g, d = rng.standard_normal((3, 3)), rng.standard_normal((4, 4))
    bt = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], float)
    at = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], float)
    u = W.transform_weights(g[None, None].astype(np.float32), 2)[:, 0, 0].reshape(4, 4)
    got = at @ (u * (bt @ d @ bt.T)) @ at.T
    want = np.array([[(d[i:i + 3, j:j + 3] * g).sum() for j in range(2)] for i in range(2)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
