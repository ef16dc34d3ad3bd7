"""ConvBlocked's Winograd as one parallel region (winograd_blocked_region.py) against Conv's numpy float64
reference: the split by tiles (odd tile counts, chunks with a shorter last one) and by output-channel parts (few
tiles, parts of unequal width), F(4x4) and F(2x2), on one and two threads, with the fused epilogues, a late
activation and the residual add."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import build_kernel, cpu_device, replay
from test_conv_blocked import B, make, run_case

from engine.devices.cpu import native_program as N
from engine.devices.cpu import threads as _threads
from engine.devices.cpu.conv import blocked as blocked_conv
from engine.devices.cpu.conv import winograd_blocked as W
from engine.devices.cpu.conv import winograd_blocked_region as R
from engine.devices.cpu.layout.blocked_ops import to_blocked, to_plain
from engine.devices.cpu.onednn import objects as onednn
from engine.errors import KernelError
from engine.ops.conv import conv_reference
from engine.ops.conv_geometry import conv_geom
from engine.ops.registry import TensorInfo

if not onednn.available():
    pytest.skip("oneDNN (libdnnl.so.3 from the onednn-cpu-gomp wheel) is not installed", allow_module_level=True)

C = 6 * B  # 6 channel blocks
O = 5 * B  # 5 output blocks: a 2-part split is 2 + 3 blocks


class Ran:
    """How a test's region ran: the slot count of each call of the slots' Python loop, and the native regions."""

    def __init__(self, n: int, native: bool):
        self.n, self.native = n, native
        self.calls: list[int] = []
        self.regions = 0

    def check(self) -> None:
        """Every run took the path the fixture asked for: the native region (winograd_team), or the slots'
        Python loop with one call per thread, each given every slot."""
        if self.native:
            assert self.regions and not self.calls
        else:
            assert self.calls and set(self.calls) == {self.n}


@pytest.fixture(params=[(1, False), (2, False), (2, True)], ids=["1thread", "2threads", "2threads-native"])
def threads(request, monkeypatch):
    """The region on n threads, from Python (the slots' loop over our pool) or as one native region on OpenMP's
    team (where our kernels' splits run natively: Intel's OpenMP under `run`, forced on here)."""
    n, native = request.param
    before = _threads.get_threads()
    _threads.set_threads(n)
    ran = Ran(n, native)
    run_slots = R._run_slots

    def counted(items, slots, *args):
        ran.calls.append(len(slots))
        run_slots(items, slots, *args)

    monkeypatch.setattr(R, "_run_slots", counted)
    if native and not _native_on(monkeypatch, ran):
        _threads.set_threads(before)
        pytest.skip("our kernels do not split over OpenMP's team here (no oneDNN or the `short` policy)")
    yield ran
    _threads.set_threads(before)


def _native_on(monkeypatch, ran: Ran) -> bool:
    """Native regions forced on (counted in `ran`); False where our kernels do not run on OpenMP's team."""
    cpu_device()
    if _threads.pool_kind(_threads.get_policy(), _threads._openmp is not None) != "openmp":
        return False
    run_native = R.run_native

    def counted_native(fn, data):
        done = run_native(fn, data)
        ran.regions += done
        return done

    monkeypatch.setattr(R, "native_regions", lambda: True)
    monkeypatch.setattr(R, "run_native", counted_native)
    return True


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
    """3 images of 33x33: 243 F(4x4) tiles (867 F(2x2)) in items no larger than U, so chunks of two lengths run
    on every slot (for either channel block, 8 or 16, and one or two threads: 25x25 split evenly with 8); the
    edge tiles clipped."""
    n_threads = threads.n
    monkeypatch.setattr(R, "ITEM_BYTES", 1)  # items as large as U's bytes
    _force(monkeypatch, tile)
    shape = (3, C, 33, 33)
    s = _expect(C, O, shape, tile, n_threads)
    assert s.parts == 1 and len(s.items()) >= 2 * n_threads and s.total % s.tiles
    node, plain = make(C, O, 3, act=act, act_params=act_params)
    run_case(node, plain, [shape], residual=residual, impl=f"winograd-f{tile}x{tile}")
    threads.check()


@pytest.mark.parametrize("tile", [4, 2])
@pytest.mark.parametrize("act,act_params", [("relu", None), ("clip", {"min": -0.3, "max": 0.4}), ("silu", None)])
@pytest.mark.parametrize("residual", [False, True])
def test_split_by_output_channels(threads, monkeypatch, tile, act, act_params, residual):
    """One 7x7 image: 4 F(4x4) tiles (16 F(2x2)), fewer than SPLIT_TILES a thread: on two threads each takes
    every tile and 2 or 3 of the 5 output blocks."""
    n_threads = threads.n
    _force(monkeypatch, tile)
    shape = (1, C, 7, 7)
    s = _expect(C, O, shape, tile, n_threads)
    assert s.parts == n_threads
    node, plain = make(C, O, 3, act=act, act_params=act_params)
    run_case(node, plain, [shape], residual=residual, impl=f"winograd-f{tile}x{tile}")
    threads.check()


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
    threads.check()
    np.testing.assert_allclose(to_plain(out, O), want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("c, k, products, threads", [(128, 128, 36, 2), (512, 512, 36, 2), (64, 512, 16, 4),
                                                     (16, 16, 36, 3), (1024, 64, 16, 2), (32, 32, 36, 8)])
def test_workspace_holds_every_smaller_shape(c, k, products, threads):
    """A smaller batch or map of the same conv may split by channels where the max shape split by tiles (each slot
    then holds all its tiles): the workspace, sized at the max shape, holds the slots of every tile count below it
    (brute force over all of them)."""
    block = 16
    for total in (1, 7, 31, 32, 33, 63, 64, 100, 257, 1500):
        bound = R.max_item_tiles(total, c, k, products)
        for t in range(1, total + 1):
            assert R.split(t, c, k, block, products, threads).tiles <= bound, (total, t)


def test_smaller_batch_needs_no_buffer_beyond_the_workspace(monkeypatch):
    """Built at batch 8 of 8x8 maps (32 F(4x4) tiles: split by tiles on two threads), run at batch 7 (28 tiles: split
    by channels, every slot holding all 28): the slots fit the planned workspace, no buffer is allocated at run
    time, and the result is the reference's."""
    monkeypatch.setattr(W, "choose", lambda geo, block, threads=1: 4)
    before = _threads.get_threads()
    _threads.set_threads(2)
    allocated = []  # the sizes the conv asked beyond its workspace (a private buffer made at run time)
    real = blocked_conv.aligned_workspace

    def spy(workspace, nbytes, private):
        if onednn.workspace_base(workspace)[1] < nbytes:
            allocated.append(nbytes)
        return real(workspace, nbytes, private)

    monkeypatch.setattr(blocked_conv, "aligned_workspace", spy)
    try:
        node, plain = make(8 * B, 8 * B, 3, act="relu")
        kernel, workspace = build_kernel(node, [TensorInfo((8, 8, 8, 8, B), np.float32)])
        rng = np.random.default_rng(5)
        for n in (8, 7, 8, 7):
            x = rng.standard_normal((n, 8 * B, 8, 8)).astype(np.float32)
            out = np.full((n, 8, 8, 8, B), np.nan, np.float32)
            kernel([to_blocked(x, B)], [out], workspace)
            np.testing.assert_allclose(to_plain(out, 8 * B), conv_reference(plain, [x])[0], rtol=1e-4, atol=1e-4)
        assert allocated == []
    finally:
        _threads.set_threads(before)


def test_plans_stay_bounded_over_many_map_sizes(monkeypatch):
    """Maps of many sizes within the max shape (a dynamic H, W) make a matmul plan per chunk length: the cache
    starts over past MAX_PLANS, and every size still matches the reference."""
    monkeypatch.setattr(W, "choose", lambda geo, block, threads=1: 4)
    monkeypatch.setattr(R, "MAX_PLANS", 3)
    regions = []
    made = R.Region.__init__
    monkeypatch.setattr(R.Region, "__init__", lambda self, *a: regions.append(self) or made(self, *a))
    node, plain = make(2 * B, 2 * B, 3)
    kernel, workspace = build_kernel(node, [TensorInfo((1, 2, 40, 40, B), np.float32)])
    rng = np.random.default_rng(9)
    for hw in (40, 9, 13, 21, 30, 17, 40, 5):
        x = rng.standard_normal((1, 2 * B, hw, hw)).astype(np.float32)
        out = np.full((1, 2, hw, hw, B), np.nan, np.float32)
        kernel([to_blocked(x, B)], [out], workspace)
        np.testing.assert_allclose(to_plain(out, 2 * B), conv_reference(plain, [x])[0], rtol=1e-4, atol=1e-4)
    used = [r for r in regions if r._plans]  # (the harness may build a kernel it does not run)
    assert used and all(len(r._plans) <= 3 for r in used)


def test_filters_transformed_once_for_all_parts(monkeypatch):
    """A split by output-channel parts packs each part's columns of U: U itself is made once for them all, and
    not kept once they are packed."""
    made = []
    region = R.Region(4 * B, 4 * B, 4, B, lambda: made.append(1) or np.ones((36, 4 * B, 4 * B), np.float32))
    region.prepare(4, 2)  # 4 tiles on 2 threads: by channels, 2 parts
    assert region.split(4, 2).parts == 2 and made == [1] and region._plain is None


def _native_case(shape: tuple, residual: bool):
    """A Winograd ConvBlocked (F(4x4), ReLU) built at `shape`: (kernel, workspace, inputs, output, float64 reference
    in NCHW)."""
    node, plain = make(C, O, 3, act="relu")
    rng = np.random.default_rng(11)
    x = rng.standard_normal(shape).astype(np.float32)
    z = rng.standard_normal((shape[0], O, *shape[2:])).astype(np.float32) if residual else None
    want = conv_reference(plain, [x] + ([z] if residual else []))[0]
    ins = [to_blocked(x, B)] + ([to_blocked(z, B)] if residual else [])
    kernel, workspace = build_kernel(node, [TensorInfo(a.shape, a.dtype) for a in ins])
    assert kernel.impl.startswith("winograd-f4x4"), kernel.impl
    return kernel, workspace, ins, np.full((shape[0], O // B, *shape[2:], B), np.nan, np.float32), want


@pytest.mark.parametrize("shape", [(2, C, 25, 25), (1, C, 7, 7)], ids=["by-tiles", "by-channels"])
@pytest.mark.parametrize("residual", [False, True])
def test_records_replay_the_region(threads, monkeypatch, shape, residual):
    """The conv recorded into a native program (fused_calls.py): the region on OpenMP's team, or its function on this
    thread for one thread; the replay writes every output element as the reference has it, run after run."""
    _force(monkeypatch, 4)
    kernel, workspace, ins, out, want = _native_case(shape, residual)
    native = kernel.native(ins, [out], workspace)
    if threads.n > 1 and not threads.native:
        assert native is None  # the slots would split over Python callbacks: the kernel's Python runs instead
        return
    assert native is not None
    assert [r[0] for r in native.records] == [N.OP_REGION if threads.n > 1 else N.OP_CALL, N.OP_WAIT]
    for _ in range(2):
        out[...] = np.nan
        assert replay(native) is None
        np.testing.assert_allclose(to_plain(out, O), want, rtol=1e-4,
                                   atol=1e-4 * max(1.0, float(np.abs(want).max())))


def test_failed_gemm_is_refused_and_leaves_nan(monkeypatch):
    """A GEMM oneDNN refuses inside the native region (here: a null primitive) raises from the kernel's run, and in
    a recorded program, which cannot raise, leaves NaN in its tiles' outputs, never a stale number."""
    before = _threads.get_threads()
    _threads.set_threads(2)
    try:
        ran = Ran(2, True)
        if not _native_on(monkeypatch, ran):
            pytest.skip("our kernels do not split over OpenMP's team here (no oneDNN or the `short` policy)")
        _failed_gemm(monkeypatch)
    finally:
        _threads.set_threads(before)
    assert ran.regions


def _failed_gemm(monkeypatch) -> None:
    _force(monkeypatch, 4)
    kernel, workspace, ins, out, _ = _native_case((2, C, 25, 25), False)
    kernel(ins, [out], workspace)  # builds the schedule
    assert np.isfinite(out).all()
    schedules = [s for conv in _winograd_convs(kernel) for s in conv.region._schedules.values() if s is not None]
    assert schedules
    for schedule in schedules:
        schedule[2][1][:, :, 3] = 0  # every slot's primitives: null
    out[...] = 1.0
    with pytest.raises(KernelError, match=r"cb: Winograd conv: oneDNN dnnl_primitive_execute failed with status"):
        kernel(ins, [out], workspace)
    assert np.isnan(out).all()  # every item failed: every tile NaN
    jobs = [entry[0] for schedule in schedules for entry in schedule[2][3].values()]
    assert jobs and not any(job[R.WJ_STATUS:].any() for job in jobs)  # cleared: a later replay reads them
    out[...] = 1.0
    native = kernel.native(ins, [out], workspace)
    ops = [r[0] for r in native.records]
    assert ops == [N.OP_REGION, N.OP_WAIT]  # the region, then its statuses as a wait
    failed = replay(native)
    assert failed is not None and failed[0] == 1 and failed[1] != 0  # the wait failed: a Segment names the node
    assert np.isnan(out).all()
    job = next(entry[0] for schedule in schedules for entry in schedule[2][3].values())
    assert not job[R.WJ_STATUS:].any()  # cleared by the wait for the next run


def _winograd_convs(kernel) -> list:
    """The WinogradConvs a blocked conv kernel holds (in its closure, or its helpers' closures)."""
    found, todo, seen = [], [kernel], set()
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        for cell in getattr(fn, "__closure__", None) or ():
            v = cell.cell_contents
            if isinstance(v, blocked_conv._Winograds):
                found += list(v._convs.values())
            elif callable(v) and hasattr(v, "__closure__"):
                todo.append(v)
    return found
