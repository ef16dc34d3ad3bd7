"""ToBlocked / ToPlain / GlobalPoolBlocked: the references against an element-by-element definition of the
layout, the numpy and oneDNN kernels against the references (padding lanes included), round trips."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import build_kernel, cpu_device, get_op, replay

from engine.devices.cpu import native_program as N
from engine.devices.cpu import threads as T
from engine.devices.cpu.layout import kernels as K
from engine.devices.cpu.layout.blocked_ops import to_blocked, to_plain
from engine.devices.cpu.onednn import blocked as onednn_blocked
from engine.devices.cpu.onednn import objects as onednn_objects
from engine.devices.cpu.onednn import pool as onednn_pool
from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import TensorInfo

rng = np.random.default_rng(5)
SHAPES = [(2, 3, 4, 5), (1, 16, 3, 3), (2, 24, 5, 4), (1, 40, 2, 7), (3, 33, 6, 5), (1, 20, 30, 25), (3, 5, 23, 24)]
# (the last two: more pixels than one sweep of layout/loops.last_block_in, LAST_BLOCK_PIXELS)
ONEDNN = pytest.mark.skipif(not onednn_objects.available(), reason="oneDNN (libdnnl.so.3) is not installed")


def by_element(x: np.ndarray, block: int) -> np.ndarray:
    """The layout's definition: channel c at [:, c // B, :, :, c % B], other lanes zero."""
    n, c, h, w = x.shape
    out = np.zeros((n, -(-c // block), h, w, block), x.dtype)
    for ch in range(c):
        out[:, ch // block, :, :, ch % block] = x[:, ch]
    return out


def node(op: str, block: int, channels: int) -> Node:
    return Node(op, op.lower(), params={"block": block, "channels": channels})


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("block", [4, 8, 16])
def test_references_follow_the_definition_and_round_trip(shape, block):
    x = rng.standard_normal(shape).astype(np.float32)
    b = get_op("ToBlocked").reference(node("ToBlocked", block, shape[1]), [x])[0]
    np.testing.assert_array_equal(b, by_element(x, block))
    assert b.flags.c_contiguous
    back = get_op("ToPlain").reference(node("ToPlain", block, shape[1]), [b])[0]
    np.testing.assert_array_equal(back, x)


def kernels() -> list:
    out = [pytest.param(K._numpy_kernel, id="numpy")]
    if onednn_objects.available():
        out.append(pytest.param(K._onednn_kernel, id="onednn"))
    return out


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("make", kernels())
def test_kernels_match_the_references(shape, make):
    block = 16
    x = rng.standard_normal(shape).astype(np.float32)
    to_b, to_p = make(True, block), make(False, block)
    b = np.full(by_element(x, block).shape, np.nan, np.float32)  # padding lanes must be written as zeros
    to_b([x], [b], None)
    np.testing.assert_array_equal(b, by_element(x, block))
    garbage = b.copy()  # a blocked value whose padding lanes are not zero (after an activation) unblocks too
    if shape[1] % block:
        garbage[:, -1, :, :, shape[1] % block:] = 0.5
    p = np.full(shape, np.nan, np.float32)
    to_p([garbage], [p], None)
    np.testing.assert_array_equal(p, x)
    smaller = x[:1].copy()  # the same kernel on a smaller batch
    b1 = np.empty((1,) + b.shape[1:], np.float32)
    to_b([smaller], [b1], None)
    np.testing.assert_array_equal(b1, by_element(smaller, block))
    p1 = np.full(smaller.shape, np.nan, np.float32)  # and back (ToPlain's per-image steps for a partial block)
    to_p([garbage[:1]], [p1], None)
    np.testing.assert_array_equal(p1, smaller)


def test_infer_checks_the_shapes():
    infer_b, infer_p = get_op("ToBlocked").infer, get_op("ToPlain").infer
    f32 = np.dtype(np.float32)
    assert infer_b(node("ToBlocked", 16, 24), [TensorInfo((2, 24, 5, 5), f32)])[0].shape == (2, 2, 5, 5, 16)
    assert infer_p(node("ToPlain", 16, 24), [TensorInfo((2, 2, 5, 5, 16), f32)])[0].shape == (2, 24, 5, 5)
    with pytest.raises(ShapeError, match="ToBlocked expects"):
        infer_b(node("ToBlocked", 16, 24), [TensorInfo((2, 16, 5, 5), f32)])
    with pytest.raises(ShapeError, match="ToPlain expects"):
        infer_p(node("ToPlain", 16, 40), [TensorInfo((2, 2, 5, 5, 16), f32)])
    with pytest.raises(ShapeError, match="positive int params"):
        infer_b(Node("ToBlocked", "t", params={"block": 16}), [TensorInfo((2, 16, 5, 5), f32)])


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "numba"])
def test_global_pool_blocked_matches_plain_pooling(mode, onednn):
    if onednn and not onednn_objects.available():
        pytest.skip("oneDNN is not installed: the numba case covers GlobalPoolBlocked")
    x = rng.standard_normal((2, 40, 5, 6)).astype(np.float32)
    want = x.mean(axis=(2, 3), keepdims=True) if mode == "avg" else x.max(axis=(2, 3), keepdims=True)
    n = Node("GlobalPoolBlocked", "gp", params={"mode": mode})
    op = get_op("GlobalPoolBlocked")
    xb = to_blocked(x, 16)
    info = op.infer(n, [TensorInfo(xb.shape, xb.dtype)])[0]
    assert info.shape == (2, 3, 1, 1, 16)
    out = np.full(info.shape, np.nan, np.float32)
    kernel = build_kernel(n, [TensorInfo(xb.shape, xb.dtype)], cpu_device(onednn=onednn))[0]
    # oneDNN's jit pooling takes blocks up to its native one (16 with AVX-512, 8 with AVX2); past it oneDNN has
    # only its reference kernel, and the numba loop runs
    assert getattr(kernel, "impl", "numba").startswith("onednn") == (onednn and 16 <= onednn_blocked.native_block())
    kernel([xb], [out], None)
    np.testing.assert_allclose(to_plain(out, 40), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out, op.reference(n, [xb])[0], rtol=1e-5, atol=1e-6)
    small = np.full((1,) + info.shape[1:], np.nan, np.float32)  # another batch and plane on the same kernel
    kernel([xb[:1, :, :3, :4]], [small], None)
    part = x[:1, :, :3, :4]
    want_small = part.mean(axis=(2, 3), keepdims=True) if mode == "avg" else part.max(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(to_plain(small, 40), want_small, rtol=1e-5, atol=1e-6)


@ONEDNN
def test_native_block_is_a_candidate():
    assert onednn_blocked.native_block() in onednn_blocked.CANDIDATE_BLOCKS


@pytest.mark.parametrize("params", [
    {"kernel": (5, 5), "stride": (1, 1), "pads": (0, 0, 5, 0), "ceil_mode": True},  # oneDNN cannot size it: numba
    {"kernel": (3, 3), "stride": (2, 2), "pads": (1, 1, 1, 1)},  # ResNet's stem pool
    {"kernel": (3, 3), "stride": (2, 2), "pads": (0, 0, 0, 0), "ceil_mode": True},  # SqueezeNet's
    {"kernel": (2, 3), "stride": (1, 2), "pads": (0, 1, 1, 0), "dilation": (2, 1)},
])
@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "numba"])
def test_maxpool_blocked_matches_plain_maxpool(params, block, onednn):
    if onednn and not onednn_objects.available():
        pytest.skip("oneDNN is not installed: the numba case covers MaxPoolBlocked")
    x = rng.standard_normal((2, 20, 9, 8)).astype(np.float32)
    plain = Node("MaxPool", "mp", params=params)
    want = get_op("MaxPool").reference(plain, [x])[0]
    n = Node("MaxPoolBlocked", "mpb", params=params)
    op = get_op("MaxPoolBlocked")
    xb = to_blocked(x, block)
    info = op.infer(n, [TensorInfo(xb.shape, xb.dtype)])[0]
    assert info.shape == (2, -(-20 // block)) + want.shape[2:] + (block,)
    kernel = build_kernel(n, [TensorInfo(xb.shape, xb.dtype)], cpu_device(onednn=onednn))[0]
    # oneDNN has only its reference kernel for dilated pooling and for blocks past its native one (see
    # test_global_pool_blocked_matches_plain_pooling): the numba loop runs those
    jit = "dilation" not in params and block <= onednn_blocked.native_block() and params["pads"][2] < 5
    assert getattr(kernel, "impl", "numba").startswith("onednn") == (onednn and jit)
    out = np.full(info.shape, np.nan, np.float32)
    kernel([xb], [out], None)
    np.testing.assert_array_equal(to_plain(out, 20), want)
    np.testing.assert_array_equal(out, op.reference(n, [xb])[0])
    small = np.full((1,) + info.shape[1:], np.nan, np.float32)  # a smaller batch on the same kernel
    kernel([xb[:1]], [small], None)
    np.testing.assert_array_equal(to_plain(small, 20), want[:1])


@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "numba"])
def test_maxpool_blocked_lets_no_nan_go(onednn):
    """oneDNN's jit max keeps whichever operand its order gives when one is NaN; the kernel then runs the numba
    loop, so a NaN wins its windows as in torch (and the reference), an infinity stays what it is."""
    if onednn and not onednn_objects.available():
        pytest.skip("oneDNN is not installed: the numba case covers MaxPoolBlocked")
    x = rng.standard_normal((1, 16, 9, 9)).astype(np.float32)
    x[0, 0, ::2, ::3] = np.nan
    x[0, 3, 4, 4] = np.nan
    x[0, 5] = -np.inf
    x[0, 6, 2, 2] = np.inf
    params = {"kernel": (3, 3), "stride": (2, 2), "pads": (1, 1, 1, 1)}
    kernel, block, out, got, want = _maxpool_blocked(params, x, onednn)
    assert np.isnan(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])
    finite = rng.standard_normal(x.shape).astype(np.float32)  # the same kernel, then back on its fast path
    kernel([to_blocked(finite, block)], [out], None)
    np.testing.assert_array_equal(to_plain(out, 16), get_op("MaxPool").reference(Node("MaxPool", "mp", params=params),
                                                                                 [finite])[0])


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Maximum", "Minimum"])
@pytest.mark.parametrize("small_first", [False, True])
@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "numba"])
def test_broadcast_blocked_matches_numpy_on_plain_data(op, small_first, onednn):
    if onednn and not onednn_objects.available():
        pytest.skip("oneDNN is not installed: the numba case covers BroadcastBlocked")
    x = rng.standard_normal((2, 40, 5, 6)).astype(np.float32)
    s = rng.standard_normal((2, 40, 1, 1)).astype(np.float32)
    fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Maximum": np.maximum, "Minimum": np.minimum}[op]
    want = fn(s, x) if small_first else fn(x, s)
    args = [to_blocked(s, 16), to_blocked(x, 16)] if small_first else [to_blocked(x, 16), to_blocked(s, 16)]
    n = Node("BroadcastBlocked", "bb", params={"op": op})
    bop = get_op("BroadcastBlocked")
    infos = [TensorInfo(a.shape, a.dtype) for a in args]
    assert bop.infer(n, infos)[0].shape == (2, 3, 5, 6, 16)
    out = np.full((2, 3, 5, 6, 16), np.nan, np.float32)
    kernel = build_kernel(n, infos, cpu_device(onednn=onednn))[0]
    on_onednn = onednn and op in ("Add", "Mul") or (onednn and op == "Sub" and not small_first)
    assert getattr(kernel, "impl", "numba").startswith("onednn") == on_onednn
    kernel(args, [out], None)
    np.testing.assert_array_equal(to_plain(out, 40), want)
    np.testing.assert_array_equal(out, bop.reference(n, args)[0])
    args1 = [a[:1].copy() for a in args]
    inplace = args1[1] if small_first else args1[0]  # in place on the full operand (the op allows it), batch 1
    kernel(args1, [inplace], None)
    np.testing.assert_array_equal(to_plain(inplace, 40), want[:1])
    with pytest.raises(ShapeError, match="not \\(N, Cb, H, W, B\\)"):
        bop.infer(n, [TensorInfo((2, 3, 5, 6, 16), np.float32), TensorInfo((2, 2, 1, 1, 16), np.float32)])


@pytest.mark.parametrize("make", kernels())
@pytest.mark.parametrize("channels", [20, 8, 32])
def test_to_plain_into_a_strided_output(make, channels):
    """A ToPlain output that is not one dense buffer (a view into a wider array) is written where it lies, by the
    strided copy, never through a raw pointer as if dense."""
    block = 16
    x = rng.standard_normal((2, channels, 5, 6)).astype(np.float32)
    wide = np.full((2, channels, 5, 12), np.nan, np.float32)
    make(False, block)([by_element(x, block)], [wide[..., ::2]], None)
    np.testing.assert_array_equal(wide[..., ::2], x)
    assert np.isnan(wide[..., 1::2]).all()


def _split_images(split: bool, monkeypatch) -> None:
    """Where `split`, a partial-last-block step's loop over the images as one region (the team forced on); skips
    where our kernels do not split over OpenMP's team."""
    cpu_device()
    if split:
        if T.pool_kind(T.get_policy(), T._openmp is not None) != "openmp" or T.get_threads() < 2:
            pytest.skip("our kernels do not split over OpenMP's team here (no oneDNN, `short` policy or one thread)")
        monkeypatch.setattr(K, "native_regions", lambda: True)
        monkeypatch.setattr(K.T, "chunks_for", lambda items, work: 2)


@ONEDNN
@pytest.mark.parametrize("shape", [(1, 20, 30, 25), (3, 5, 23, 24), (1, 40, 2, 7)])
@pytest.mark.parametrize("split", [False, True])
def test_a_partial_last_block_replays_as_the_kernel_ran(shape, split, monkeypatch):
    """ToBlocked's partial-last-block step as native_program records (a program that holds it never falls back to
    Python): the reorders of the whole blocks and the last block's loop, on this thread or as one region over the
    images (`split`, the team forced on where our kernels run on OpenMP's team), write what the kernel wrote."""
    _split_images(split, monkeypatch)
    x = rng.standard_normal(shape).astype(np.float32)
    to_b = K._onednn_kernel(True, 16)
    want = np.full(by_element(x, 16).shape, np.nan, np.float32)
    to_b([x], [want], None)
    np.testing.assert_array_equal(want, by_element(x, 16))
    got = np.full_like(want, np.nan)
    native = to_b.native([x], [got], None)
    assert native is not None
    ops = {r[0] for r in native.records}
    assert (N.OP_REGION in ops) == split
    assert replay(native) is None
    np.testing.assert_array_equal(got, want)


@ONEDNN
@pytest.mark.parametrize("shape", [(1, 20, 30, 25), (3, 40, 2, 7), (2, 33, 5, 6), (1, 17, 1, 1)])
@pytest.mark.parametrize("split", [False, True])
def test_a_partial_last_block_back_to_plain_replays_as_the_kernel_ran(shape, split, monkeypatch):
    """ToPlain's partial-last-block step (C > B): the whole blocks' reorders and the last block's lanes by the
    numba loop, on this thread or as one region over the images (`split`); run and replayed, the plain value
    exactly (a copy), the padding lanes never read into it."""
    _split_images(split, monkeypatch)
    x = rng.standard_normal(shape).astype(np.float32)
    blocked = by_element(x, 16)
    blocked[:, -1, :, :, shape[1] % 16:] = np.nan  # padding lanes: never copied out
    to_p = K._onednn_kernel(False, 16)
    want = np.full(shape, np.nan, np.float32)
    to_p([blocked], [want], None)
    np.testing.assert_array_equal(want, x)
    got = np.full_like(want, np.nan)
    native = to_p.native([blocked], [got], None)
    assert native is not None
    assert (N.OP_REGION in {r[0] for r in native.records}) == split
    assert replay(native) is None
    np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("split", [False, True], ids=["one-thread-check", "team-check"])
def test_maxpool_blocked_replays_with_its_nan_check(split, monkeypatch):
    """MaxPoolBlocked recorded into a native program: the NaN check (over the team where it splits), oneDNN's pooling,
    then the exact loop where the check flagged a NaN or an infinity. Replayed on a finite input it writes oneDNN's
    (exact) maxima; after a NaN and an infinity are put into the arena value, the same program writes the
    reference's NaN windows and infinities; finite again, the fast path's maxima (the flags cleared)."""
    if not onednn_objects.available():
        pytest.skip("oneDNN is not installed: no oneDNN pooling to record")
    cpu_device()
    if split:
        if T.pool_kind(T.get_policy(), T._openmp is not None) != "openmp" or T.get_threads() < 2:
            pytest.skip("our kernels do not split over OpenMP's team here (no oneDNN, `short` policy or one thread)")
        monkeypatch.setattr(onednn_pool, "native_regions", lambda: True)
        monkeypatch.setattr(onednn_pool, "threads_for", lambda work: 2)
    params = {"kernel": (3, 3), "stride": (2, 2), "pads": (0, 0, 0, 0), "ceil_mode": True}
    plain, n = Node("MaxPool", "mp", params=params), Node("MaxPoolBlocked", "mpb", params=params)
    block = onednn_blocked.native_block() or 8
    x = rng.standard_normal((2, 3 * block, 13, 13)).astype(np.float32)
    xb = to_blocked(x, block)
    kernel = build_kernel(n, [TensorInfo(xb.shape, xb.dtype)])[0]
    assert kernel.impl.startswith("onednn")
    out = np.full(get_op("MaxPoolBlocked").infer(n, [TensorInfo(xb.shape, xb.dtype)])[0].shape, 7.0, np.float32)
    kernel([xb], [out], None)  # the Python path first, as a binding's first runs
    native = kernel.native([xb], [out], None)
    assert native is not None
    ops = [r[0] for r in native.records]
    assert ops[0] == (N.OP_REGION if split else N.OP_CALL) and ops[-1] == N.OP_CALL and N.OP_EXEC in ops

    def pooled(values: np.ndarray) -> np.ndarray:
        xb[...] = to_blocked(values, block)
        out[...] = 7.0
        assert replay(native) is None
        return to_plain(out, x.shape[1])

    def want(values: np.ndarray) -> np.ndarray:
        return get_op("MaxPool").reference(plain, [values])[0]

    np.testing.assert_array_equal(pooled(x), want(x))
    bad = x.copy()
    bad[1, block + 2, 5, 6] = np.nan  # in the second image and block: another thread's share of the check
    bad[0, 0, 0, 0] = np.inf
    got, expect = pooled(bad), want(bad)
    assert np.isnan(expect).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expect))
    np.testing.assert_array_equal(got[~np.isnan(expect)], expect[~np.isnan(expect)])
    np.testing.assert_array_equal(pooled(x), want(x))


@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "numba"])
def test_maxpool_blocked_window_without_an_input_pixel_is_minus_inf(onednn):
    """A dilated window can step over a small input entirely (2x2, dilation 5, pad 2 on 4x4: the middle row and
    column of windows read only padding): -inf there, as the reference (and the plain MaxPool kernel) gives, not
    whatever the output buffer held."""
    if onednn and not onednn_objects.available():
        pytest.skip("oneDNN is not installed: the numba case covers MaxPoolBlocked")
    params = {"kernel": (2, 2), "stride": (1, 1), "pads": (2, 2, 2, 2), "dilation": (5, 5)}
    x = rng.standard_normal((2, 20, 4, 4)).astype(np.float32)
    got, want = _maxpool_blocked(params, x, onednn)[3:]
    assert np.isneginf(want).any() and np.isfinite(want).any()
    np.testing.assert_array_equal(got, want)


def _maxpool_blocked(params: dict, x: np.ndarray, onednn: bool) -> tuple:
    """MaxPoolBlocked's kernel (oneDNN's or the numba loop) on x's blocked value (the CPU's block, else 8), run once
    into an output filled with 7.0 first: (kernel, block, output, output as NCHW, MaxPool's reference of x)."""
    want = get_op("MaxPool").reference(Node("MaxPool", "mp", params=params), [x])[0]
    n = Node("MaxPoolBlocked", "mpb", params=params)
    block = onednn_blocked.native_block() or 8
    xb = to_blocked(x, block)
    info = get_op("MaxPoolBlocked").infer(n, [TensorInfo(xb.shape, xb.dtype)])[0]
    kernel = build_kernel(n, [TensorInfo(xb.shape, xb.dtype)], cpu_device(onednn=onednn))[0]
    out = np.full(info.shape, 7.0, np.float32)
    kernel([xb], [out], None)
    return kernel, block, out, to_plain(out, x.shape[1]), want
