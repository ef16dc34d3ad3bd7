"""ConvBlocked's Winograd as one parallel region (winograd_blocked_region.py) against Conv's numpy float64
reference: the split by tiles (odd tile counts, chunks with a shorter last one) and by output-channel parts (few
tiles, parts of unequal width), F(4x4) and F(2x2), on one and two threads, with the fused epilogues, a late
activation and the residual add."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import build_kernel
from test_conv_blocked import B, make, run_case

from engine.devices.cpu import threads as _threads
from engine.devices.cpu.conv import winograd_blocked as W
from engine.devices.cpu.conv import winograd_blocked_region as R
from engine.devices.cpu.layout.blocked_ops import to_blocked, to_plain
from engine.devices.cpu.onednn import objects as onednn
from engine.ops.conv import conv_reference
from engine.ops.conv_geometry import conv_geom
from engine.ops.registry import TensorInfo

if not onednn.available():
    pytest.skip("oneDNN (libdnnl.so.3 from the onednn-cpu-gomp wheel) is not installed", allow_module_level=True)

C = 6 * B  # 6 channel blocks
O = 5 * B  # 5 output blocks: a 2-part split is 2 + 3 blocks


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request, monkeypatch):
    """The region on `threads` threads; the slot count of each call of the slots' loop (one per thread)."""
    before = _threads.get_threads()
    _threads.set_threads(request.param)
    calls = []
    run_slots = R._run_slots

    def counted(items, slots, *args):
        calls.append(len(slots))
        run_slots(items, slots, *args)

    monkeypatch.setattr(R, "_run_slots", counted)
    yield request.param, calls
    _threads.set_threads(before)


def _force(monkeypatch, tile: int) -> None:
    monkeypatch.setattr(W, "choose", lambda geo, block, threads=1: tile)


def _expect(c: int, o: int, shape: tuple, tile: int, threads: int) -> R.Split:
    _, plain = make(c, o, 3)
    geo = conv_geom(plain, shape)
    th, tw = W.tiles(geo, tile)
    return R.split(geo.n * th * tw, c, o, B, (tile + 2) ** 2, threads)


@pytest.mark.parametrize("tile", [4, 2])
@pytest.mark.parametrize("act,act_params", [(None, None), ("relu", None), ("leaky_relu", {"alpha": 0.1}),
                                            ("clip", {"min": -0.3, "max": 0.4}), ("silu", None)])
@pytest.mark.parametrize("residual", [False, True])
def test_split_by_tiles(threads, monkeypatch, tile, act, act_params, residual):
    """3 images of 25x25: 147 F(4x4) tiles (507 F(2x2)) in items no larger than U, so chunks of two lengths run
    on every slot; the edge tiles clipped."""
    n_threads, calls = threads
    monkeypatch.setattr(R, "ITEM_BYTES", 1)  # items as large as U's bytes
    _force(monkeypatch, tile)
    shape = (3, C, 25, 25)
    s = _expect(C, O, shape, tile, n_threads)
    assert s.parts == 1 and len(s.items()) >= 2 * n_threads and s.total % s.tiles
    node, plain = make(C, O, 3, act=act, act_params=act_params)
    run_case(node, plain, [shape], residual=residual, impl=f"winograd-f{tile}x{tile}")
    assert calls and calls[-1] == n_threads


@pytest.mark.parametrize("tile", [4, 2])
@pytest.mark.parametrize("act,act_params", [("relu", None), ("clip", {"min": -0.3, "max": 0.4}), ("silu", None)])
@pytest.mark.parametrize("residual", [False, True])
def test_split_by_output_channels(threads, monkeypatch, tile, act, act_params, residual):
    """One 7x7 image: 4 F(4x4) tiles (16 F(2x2)), fewer than SPLIT_TILES a thread: on two threads each takes
    every tile and 2 or 3 of the 5 output blocks."""
    n_threads, calls = threads
    _force(monkeypatch, tile)
    shape = (1, C, 7, 7)
    s = _expect(C, O, shape, tile, n_threads)
    assert s.parts == n_threads
    node, plain = make(C, O, 3, act=act, act_params=act_params)
    run_case(node, plain, [shape], residual=residual, impl=f"winograd-f{tile}x{tile}")
    assert calls and calls[-1] == n_threads


def test_smaller_batch_on_the_same_workspace(threads, monkeypatch):
    """Built at batch 4 (split by tiles), then batch 1 (few tiles: by channels on two threads) and batch 4 again,
    on one kernel and workspace."""
    _force(monkeypatch, 4)
    node, plain = make(C, O, 3, act="relu")
    run_case(node, plain, [(4, C, 13, 13), (1, C, 5, 5), (4, C, 13, 13)], residual=True, impl="winograd-f4x4")


@pytest.mark.parametrize("total,kblocks,threads", [(27, 5, 2), (196, 4, 2), (4, 32, 2), (16, 16, 2), (5, 1, 2),
                                                   (1, 3, 1), (49, 8, 1)])
def test_items_cover_every_tile_and_block_once(total, kblocks, threads):
    s = R.split(total, 64, kblocks * B, B, 36, threads)
    seen = np.zeros((total, kblocks), int)
    for t0, t1, kb0, kb1 in s.items():
        assert t0 < t1 and kb0 < kb1
        seen[t0:t1, kb0:kb1] += 1
    assert (seen == 1).all()
    if s.parts == 1:  # every slot the same number of items
        assert len(s.items()) % threads == 0 or len(s.items()) == total


def test_more_threads_than_the_workspace_was_sized_for(monkeypatch):
    """Built (and its workspace sized) on one thread, run on two: the slots do not fit, the chunked steps run."""
    _force(monkeypatch, 4)
    ran = []
    region_run = R.Region.run

    def spied(self, *args):
        ran.append(region_run(self, *args))
        return ran[-1]

    monkeypatch.setattr(R.Region, "run", spied)
    monkeypatch.setattr(W, "CHUNK_BYTES", 1)  # the chunks' buffers smaller than the region's on two threads
    node, plain = make(C, O, 3, act="relu")
    x = np.random.default_rng(5).standard_normal((2, C, 25, 25)).astype(np.float32)
    want = conv_reference(plain, [x])[0]
    before = _threads.get_threads()
    _threads.set_threads(1)
    try:
        ins = [to_blocked(x, B)]
        kernel, workspace = build_kernel(node, [TensorInfo(ins[0].shape, ins[0].dtype)])
        _threads.set_threads(2)
        out = np.full((2, O // B, 25, 25, B), np.nan, np.float32)
        kernel(ins, [out], workspace)
    finally:
        _threads.set_threads(before)
    assert ran == [False]
    np.testing.assert_allclose(to_plain(out, O), want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("shape", [(2, C, 25, 25), (1, C, 7, 7)], ids=["by-tiles", "by-channels"])
def test_eight_lane_blocks(threads, monkeypatch, shape):
    """AVX2's 8-lane blocks (winograd_simd's vectors one to a pixel), both split kinds, a residual and ReLU."""
    n_threads, calls = threads
    _force(monkeypatch, 4)
    node, plain = make(C, O, 3, act="relu")
    node.params["block"] = 8
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(np.float32)
    z = rng.standard_normal((shape[0], O, *shape[2:])).astype(np.float32)
    want = conv_reference(plain, [x, z])[0]
    ins = [to_blocked(x, 8), to_blocked(z, 8)]
    kernel, workspace = build_kernel(node, [TensorInfo(a.shape, a.dtype) for a in ins])
    assert kernel.impl.startswith("winograd-f4x4"), kernel.impl
    out = np.full(ins[1].shape, np.nan, np.float32)
    kernel(ins, [out], workspace)
    assert calls and set(calls) == {n_threads}  # one call per thread, each given every slot
    np.testing.assert_allclose(to_plain(out, O), want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
