"""RegroupBlocked: the reference against numpy's Concat / Split / channel shuffle on plain data, the lane-copy
kernel against the reference (padding lanes included), smaller batches and other plane sizes on the same
kernel, composed maps, errors."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import build_kernel, cpu_device, get_op

from engine.devices.cpu import threads
from engine.devices.cpu.layout import kernels as layout_kernels
from engine.devices.cpu.layout.blocked_ops import to_blocked, to_plain
from engine.devices.cpu.layout.regroup import concat_sources, shuffle_sources, split_sources
from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import TensorInfo

rng = np.random.default_rng(11)
OP = get_op("RegroupBlocked")


PERMUTED: list[int] = []  # the dst sizes permute_lanes wrote (the lane_path fixture counts them)


@pytest.fixture(autouse=True, params=["permutes", "copies"])
def lane_path(request, monkeypatch):
    """Every test on both ways of moving lanes: vector permutes (where this CPU has them natively for the block) and
    lane copies (every other CPU)."""
    if request.param == "copies":
        monkeypatch.setattr(layout_kernels, "native_width", lambda width: False)
    real = layout_kernels._permute
    PERMUTED.clear()
    monkeypatch.setattr(layout_kernels, "_permute", lambda words, dst, pm, chunk: (PERMUTED.append(dst.size),
                                                                                  real(words, dst, pm, chunk)))
    return request.param


def shuffle(x: np.ndarray, groups: int) -> np.ndarray:
    """torch.nn.functional.channel_shuffle, written out."""
    n, c, h, w = x.shape
    return x.reshape(n, groups, c // groups, h, w).transpose(0, 2, 1, 3, 4).reshape(n, c, h, w)


def regroup(block: int, channels: list[int], sources) -> Node:
    return Node("RegroupBlocked", "rg", params={"block": block, "channels": channels, "sources": sources})


def run_kernel(node: Node, arrays: list[np.ndarray], kernel=None) -> list[np.ndarray]:
    infos = [TensorInfo(a.shape, a.dtype) for a in arrays]
    outs = [np.full(i.shape, np.nan, np.float32) for i in OP.infer(node, infos)]
    (kernel or build_kernel(node, infos)[0])(arrays, outs, None)
    return outs


def check(node: Node, plain_inputs: list[np.ndarray], want: list[np.ndarray], block: int) -> None:
    """Reference and kernel both give `want` (blocked, padding lanes zero); the same kernel at batch 1 and on a
    smaller plane."""
    blocked = [to_blocked(x, block) for x in plain_inputs]
    expected = [to_blocked(y, block) for y in want]
    kernel = build_kernel(node, [TensorInfo(a.shape, a.dtype) for a in blocked])[0]
    for got in (OP.reference(node, blocked), run_kernel(node, blocked, kernel)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_array_equal(g, e)
    # batch 1 on a smaller plane (the lane maps are planned at the max shape), as contiguous arrays and as views
    views = [b[:1, :, :2, :1] for b in blocked]
    for small in ([np.ascontiguousarray(v) for v in views], views):
        for g, e in zip(run_kernel(node, small, kernel), expected, strict=True):
            np.testing.assert_array_equal(g, e[:1, :, :2, :1])
    # a strided output is written whole (the loops write through a reshape, which of a view would be a copy)
    outs = [np.full(e.shape[:-1] + (2 * block,), np.nan, np.float32)[..., :block] for e in expected]
    kernel(blocked, outs, None)
    for g, e in zip(outs, expected, strict=True):
        np.testing.assert_array_equal(g, e)
    assert bool(PERMUTED) == ("permute_lanes" in kernel.impl)  # the path the kernel says it takes ran


@pytest.mark.parametrize("chans", [(8, 8), (24, 24), (5, 16, 7)])
def test_concat_of_a_plane_larger_than_one_work_item(chans):
    """A plane of more pixels than one work item of the lane copy (its items are chunks of a block's pixels, split
    over the threads), with runs of lanes from two sources in one block (GhostNet's ghost concats)."""
    xs = [rng.standard_normal((2, c, 45, 50)).astype(np.float32) for c in chans]
    check(regroup(16, list(chans), concat_sources(list(chans))), xs, [np.concatenate(xs, axis=1)], 16)


@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("chans", [(58, 58), (16, 24), (3, 5, 16), (24, 8), (12, 13, 7)])  # runs of 1-16 lanes
def test_concat(block, chans):
    xs = [rng.standard_normal((2, c, 5, 3)).astype(np.float32) for c in chans]
    check(regroup(block, list(chans), concat_sources(list(chans))), xs, [np.concatenate(xs, axis=1)], block)


@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("sizes", [(58, 58), (16, 16), (3, 21, 8), (116, 116)])
def test_split(block, sizes):
    x = rng.standard_normal((2, sum(sizes), 4, 6)).astype(np.float32)
    node = regroup(block, [sum(sizes)], split_sources(list(sizes)))
    check(node, [x], np.split(x, np.cumsum(sizes)[:-1], axis=1), block)


@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("c,groups", [(116, 2), (232, 2), (24, 3), (16, 4)])
def test_channel_shuffle(block, c, groups):
    x = rng.standard_normal((2, c, 3, 7)).astype(np.float32)
    check(regroup(block, [c], shuffle_sources(c, groups)), [x], [shuffle(x, groups)], block)


@pytest.mark.parametrize("block", [8, 16])
def test_shufflenet_unit_as_one_map(block):
    """concat -> shuffle -> split composed by hand: what the layout pass builds for ShuffleNetV2."""
    a, b = (rng.standard_normal((2, 58, 4, 4)).astype(np.float32) for _ in range(2))
    cat, shuf = concat_sources([58, 58])[0], shuffle_sources(116, 2)[0]
    sources = [[cat[shuf[c][1]] for c in range(first, first + 58)] for first in (0, 58)]
    want = np.split(shuffle(np.concatenate([a, b], axis=1), 2), 2, axis=1)
    check(regroup(block, [58, 58], sources), [a, b], want, block)


def test_whole_blocks_are_copied_from_the_right_images():
    x = rng.standard_normal((3, 32, 4, 4)).astype(np.float32)
    a, b = run_kernel(regroup(8, [32], split_sources([16, 16])), [to_blocked(x, 8)])
    np.testing.assert_array_equal(to_plain(a, 16), x[:, :16])
    np.testing.assert_array_equal(to_plain(b, 16), x[:, 16:])


def test_errors_name_the_node():
    with pytest.raises(ShapeError, match="rg.*out of range"):
        OP.infer(regroup(8, [8], [[(0, 8)]]), [TensorInfo((1, 1, 2, 2, 8), np.float32)])
    with pytest.raises(ShapeError, match="rg.*input for 9 channels"):
        OP.infer(regroup(8, [8, 9], concat_sources([8, 9])), [TensorInfo((1, 1, 2, 2, 8), np.float32)] * 2)
    with pytest.raises(ShapeError, match="rg.*2 channel counts for 1 inputs"):
        OP.infer(regroup(8, [8, 8], concat_sources([8, 8])), [TensorInfo((1, 1, 2, 2, 8), np.float32)])


@pytest.fixture
def copy_regions(monkeypatch, request):
    """Every lane copy and permute split as a native region (NATIVE_COPY_FLOATS, NATIVE_PERMUTE_FLOATS 0), even where
    the suite's team sleeps; records whether each region ran."""
    cpu_device()
    if threads.pool_kind(threads.get_policy(), threads._openmp is not None) != "openmp":
        pytest.skip("our kernels do not run on OpenMP's team here (no oneDNN, or the `short` wait policy)")
    runs: list[bool] = []
    real = layout_kernels.run_native
    monkeypatch.setattr(layout_kernels, "run_native", lambda fn, data: (runs.append(real(fn, data)), runs[-1])[1])
    monkeypatch.setattr(layout_kernels, "native_regions", lambda: True)
    monkeypatch.setattr(layout_kernels, "NATIVE_COPY_FLOATS", 0)
    monkeypatch.setattr(layout_kernels, "NATIVE_PERMUTE_FLOATS", 0)
    before = threads.get_threads()
    request.addfinalizer(lambda: threads.set_threads(before))
    return runs


@pytest.mark.parametrize("n_threads", [2, 3])
@pytest.mark.parametrize("block", [8, 16])
def test_native_region_copies_match(block, n_threads, copy_regions):
    """Concats (GhostNet's 8+8 and 24+24, odd runs), a split and a shuffle with every lane copy split over 2-3
    threads as one native region: the same blocked values, padding lanes zero, at batch 2, batch 1 and a smaller
    plane."""
    threads.set_threads(n_threads)
    for chans in ((8, 8), (24, 24), (5, 16, 7)):
        xs = [rng.standard_normal((2, c, 45, 50)).astype(np.float32) for c in chans]
        check(regroup(block, list(chans), concat_sources(list(chans))), xs, [np.concatenate(xs, axis=1)], block)
    x = rng.standard_normal((2, 40, 9, 7)).astype(np.float32)
    check(regroup(block, [40], split_sources([13, 27])), [x], np.split(x, [13], axis=1), block)
    check(regroup(block, [40], shuffle_sources(40, 2)), [x], [shuffle(x, 2)], block)
    assert copy_regions and all(copy_regions)


def test_native_copy_declines_what_it_cannot_take(monkeypatch):
    """Under NATIVE_COPY_FLOATS, on one thread, or on a non-contiguous source: nothing run, False."""
    monkeypatch.setattr(layout_kernels, "native_regions", lambda: True)
    monkeypatch.setattr(layout_kernels, "run_native", lambda fn, data: pytest.fail("no region expected"))
    x = to_blocked(rng.standard_normal((1, 16, 4, 4)).astype(np.float32), 16)
    dst = np.empty((1, 1, 16, 16), np.float32)
    c = layout_kernels._Copy([(0, k) for k in range(16)], 0, 16, 16)
    assert not layout_kernels._native_copy(x, dst, c, 1024)  # 256 floats: small
    monkeypatch.setattr(layout_kernels, "NATIVE_COPY_FLOATS", 0)
    assert not layout_kernels._native_copy(np.asfortranarray(x), dst, c, 1024)
    monkeypatch.setattr(layout_kernels, "get_threads", lambda: 1)
    assert not layout_kernels._native_copy(x, dst, c, 1024)


@pytest.mark.parametrize("block", [8, 16])
def test_permutes_take_the_maps_they_pay_for(block, lane_path):
    """ShuffleNetV2's concat-shuffle-split by permutes where this CPU has them natively (2-4 steps a block); a
    shuffle of 8 groups (8-16 source blocks a block) and every map on other CPUs by lane copies."""
    cat, shuf = concat_sources([58, 58])[0], shuffle_sources(116, 2)[0]
    unit = regroup(block, [58, 58], [[cat[shuf[c][1]] for c in range(first, first + 58)] for first in (0, 58)])
    infos = [TensorInfo((1, -(-58 // block), 3, 3, block), np.float32)] * 2
    native = lane_path == "permutes" and layout_kernels.native_width(block)
    assert build_kernel(unit, infos)[0].impl == ("numba:permute_lanes" if native else "numba:copy_lanes")
    wide = regroup(block, [128], shuffle_sources(128, 8))
    assert build_kernel(wide, [TensorInfo((1, 128 // block, 3, 3, block), np.float32)])[0].impl == "numba:copy_lanes"
    x = rng.standard_normal((2, 128, 3, 5)).astype(np.float32)
    check(wide, [x], [shuffle(x, 8)], block)
