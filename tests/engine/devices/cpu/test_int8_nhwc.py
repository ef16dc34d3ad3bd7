"""The NHWC int8 kernels (engine/devices/cpu/int8/) match the numpy references of engine/ops/quant.py bit for bit.

The oneDNN convolution is run on every way it has (int8 out with tie-free factors, int32 sums plus the numba
epilogue, the numba direct loop), on adversarial factors that make exact ties k + 0.5 reachable, and on shapes
below the max shapes it was built for. The factor search itself is checked by enumerating every reachable sum.
"""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import (
    build_kernel,
    cpu_device,
    force_native_regions,
    infer,
    infos_of,
    make_node,
    reference,
    replay,
    run_kernel,
)

from engine.devices.cpu import native_program as N
from engine.devices.cpu import threads
from engine.devices.cpu.int8 import conv as int8_conv
from engine.devices.cpu.int8 import kernels as int8_kernels
from engine.devices.cpu.int8 import loops
from engine.devices.cpu.int8.loops import softmax_rows
from engine.devices.cpu.int8.ops import to_nhwc
from engine.devices.cpu.int8.requant import sum_range, tie_free_scales
from engine.devices.cpu.onednn.objects import available
from engine.errors import InputValueError, KernelError
from engine.ops.quant import float2int8

RNG = np.random.default_rng(20)
F32 = np.float32
pytestmark = pytest.mark.skipif(not available(), reason="oneDNN is not installed")


def _i8(*shape, lo=-128):
    return RNG.integers(lo, 128, shape, dtype=np.int8)


def _check(node, arrays, max_arrays=None):
    want = reference(node, arrays)
    got = run_kernel(node, arrays, max_arrays)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def _qconv(o, c, k, groups=1, stride=1, pads=0, dilation=1, activation=None, fusion=None, unsigned=False,
           scale=None, weight=None, zero_point=0):
    # symmetric weights, as TNN's and `nnserve quantize`'s (a -128 keeps a spread conv off oneDNN: conv._spreadable)
    weight = _i8(o, c // groups, k, k, lo=-127) if weight is None else weight
    attrs = {"weight": weight, "bias": RNG.integers(-3000, 3000, o).astype(np.int32),
             "scale": RNG.uniform(0.0005, 0.003, o).astype(np.float32) if scale is None else scale,
             "relu6_max": RNG.integers(20, 120, o).astype(np.int8)}
    if fusion:
        attrs["add_scale"] = RNG.uniform(0.2, 1.5, o).astype(np.float32)
    params = {"groups": groups, "stride": [stride, stride], "pads": [pads, pads], "dilation": [dilation, dilation],
              "activation": activation, "fusion": fusion, "src_unsigned": unsigned}
    if zero_point:
        params["src_zero_point"] = zero_point
    return make_node("Int8ConvNhwc", 2 if fusion else 1, params=params, attrs=attrs)


def _conv_inputs(node, n, c, h, w):
    x = _i8(n, h, w, c, lo=0 if node.params["src_unsigned"] else -128)
    if not node.params.get("fusion"):
        return [x]
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = (node.attrs["weight"].shape[2:], node.params["stride"],
                                              node.params["pads"], node.params["dilation"])
    oh, ow = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return [x, _i8(n, oh, ow, node.attrs["weight"].shape[0])]


CONVS = [
    dict(o=5, c=3, k=3, stride=2, pads=1),                      # first-layer conv, odd sizes, signed input
    dict(o=6, c=4, k=3, groups=2, dilation=2, pads=2, activation="relu", unsigned=True),
    dict(o=7, c=7, k=3, groups=7, stride=2, pads=1, activation="relu6", unsigned=True),   # depthwise
    dict(o=24, c=24, k=3, groups=24, pads=1, activation="relu"),                         # depthwise, signed
    dict(o=9, c=6, k=1, activation="relu"),                      # pointwise
    dict(o=4, c=6, k=1, groups=2),                               # grouped pointwise
    dict(o=3, c=5, k=2, stride=3),                               # kernel narrower than the stride
    dict(o=5, c=4, k=1, fusion="add_then_act", activation="relu"),
    dict(o=5, c=4, k=1, fusion="act_then_add", activation="relu", unsigned=True),
    dict(o=5, c=4, k=1, fusion="add_then_act", activation="relu6"),
    dict(o=5, c=4, k=3, pads=1, fusion="add_then_act"),
    dict(o=40, c=33, k=3, pads=1, activation="relu6", unsigned=True),
]


@pytest.mark.parametrize("cfg", CONVS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_conv_is_bit_exact(cfg):
    node = _qconv(**cfg)
    big = _conv_inputs(node, 2, cfg["c"], 9, 8)
    small = _conv_inputs(node, 1, cfg["c"], 6, 7)
    _check(node, big)
    _check(node, small, big)  # below the max shape: a second primitive


@pytest.mark.parametrize("channels", [2, 5, 12, 15, 17, 30])
@pytest.mark.parametrize("stride,activation", [(1, None), (2, "relu6")])
def test_depthwise_conv_of_any_channel_count_is_bit_exact(channels, stride, activation):
    # oneDNN's AVX2 depthwise kernel wrote wrong channels for tails of 2-7 channels with the requant way's
    # post-ops (conv._dw_tail_miscomputed): such convs take the int32 way there; on AVX-512 this holds as it is
    node = _qconv(channels, channels, 3, groups=channels, stride=stride, pads=1, activation=activation,
                  unsigned=True)
    big = _conv_inputs(node, 2, channels, 9, 8)
    _check(node, big)
    _check(node, _conv_inputs(node, 1, channels, 6, 7), big)


@pytest.mark.parametrize("fusion,activation", [("add_then_act", None), ("act_then_add", "relu6")])
def test_fused_pointwise_conv_runs_in_tiles_of_pixels(fusion, activation, monkeypatch):
    # 2 x 53 x 51 pixels of 40 channels' int32 sums are beyond TILE_BYTES: full tiles and a rest, each its own
    # primitive, the sums of one tile at a time in the workspace (tiles of TILE_BYTES: no cap on their count)
    monkeypatch.setattr(int8_conv, "MAX_TILES", 1 << 30)
    node = _qconv(40, 24, 1, fusion=fusion, activation=activation)
    big = _conv_inputs(node, 2, 24, 53, 51)
    fn, _ = build_kernel(node, infos_of(big, node=node))
    plan = next(iter(fn.plans.values()))
    assert plan.way == "int32" and len({k for _, k, _ in plan.tiles}) == 2
    assert plan.acc_bytes < 2 * 53 * 51 * 40 * 4
    _check(node, big)
    _check(node, _conv_inputs(node, 1, 24, 50, 47), big)


@pytest.mark.parametrize("threads_n", [1, 2])
def test_large_fused_pointwise_conv_takes_at_most_max_tiles_each_run_whole(threads_n, monkeypatch):
    # 2 x 97 x 89 pixels of 40 channels' sums would be 11 tiles of TILE_BYTES: MAX_TILES larger ones instead, none
    # tiled again (a tile's primitive writes all its sums: the workspace must hold a whole one), exact at the max
    # shape and below it
    monkeypatch.setattr(threads, "MIN_WORK", 0)
    monkeypatch.setattr(int8_conv, "MAX_TILE_BYTES", 1 << 30)  # the count's cap alone (the size's: below)
    before = threads.get_threads()
    threads.set_threads(threads_n)
    try:
        node = _qconv(40, 24, 1, fusion="add_then_act")
        big = _conv_inputs(node, 2, 24, 97, 89)
        fn, _ = build_kernel(node, infos_of(big, node=node))
        plan = next(iter(fn.plans.values()))
        pixels = 2 * 97 * 89
        assert plan.way == "int32" and len(plan.tiles) == int8_conv.MAX_TILES
        assert sum(k for _, k, _ in plan.tiles) == pixels
        assert all(not tile.tiles for _, _, tile in plan.tiles)
        assert plan.acc_bytes >= max(k for _, k, _ in plan.tiles) * 40 * 4
        _check(node, big)
        _check(node, _conv_inputs(node, 1, 24, 60, 71), big)
    finally:
        threads.set_threads(before)


def test_tiles_of_a_large_output_stay_within_max_tile_bytes(monkeypatch):
    # a large map's sums: tiles of MAX_TILE_BYTES (here made small), however many, so the workspace holds one of
    # them and never half the output's sums; exact, the rest tile included
    monkeypatch.setattr(int8_conv, "MAX_TILE_BYTES", 2 * int8_conv.TILE_BYTES)
    node = _qconv(40, 24, 1, fusion="add_then_act")
    big = _conv_inputs(node, 2, 24, 101, 97)
    fn, _ = build_kernel(node, infos_of(big, node=node))
    plan = next(iter(fn.plans.values()))
    per = int8_conv.MAX_TILE_BYTES // (40 * 4)
    assert plan.way == "int32" and len(plan.tiles) == -(-2 * 101 * 97 // per) > int8_conv.MAX_TILES
    assert {k for _, k, _ in plan.tiles[:-1]} == {per} and plan.acc_bytes <= int8_conv.MAX_TILE_BYTES + 64
    _check(node, big)
    _check(node, _conv_inputs(node, 1, 24, 30, 29), big)


@pytest.mark.parametrize("fusion,activation", [("add_then_act", None), ("add_then_act", "relu"),
                                               ("act_then_add", "relu"), ("add_then_act", "relu6")])
def test_fused_epilogue_runs_flat_over_whole_pixels(monkeypatch, fusion, activation):
    # the int32 way's epilogue runs flat over runs of whole pixels (loops.tiled): an odd channel count, pixels
    # that are no multiple of a run, a batch of 3 and three threads splitting the pixels at odd places
    before = threads.get_threads()
    monkeypatch.setattr(threads, "MIN_WORK", 0)
    threads.set_threads(3)
    try:
        node = _qconv(37, 11, 1, fusion=fusion, activation=activation, unsigned=True)
        x = _conv_inputs(node, 3, 11, 7, 5)
        fn, _ = build_kernel(node, infos_of(x, node=node))
        assert next(iter(fn.plans.values())).way == "int32"
        _check(node, x)
        _check(node, _conv_inputs(node, 1, 11, 3, 2), x)  # fewer pixels than one run
    finally:
        threads.set_threads(before)


@pytest.mark.parametrize("fused", [False, True])
def test_epilogue_adds_the_bias_as_the_reference_for_any_int32_sums(fused):
    # the loops add sum and bias in float64 and round once to float32, the reference in int64 and then to float32:
    # the same for every pair of int32s (sums and biases at and near both ends, and where float32 starts skipping
    # integers). Rows of pairs whose sum lands on a float32 tie k + 2 between multiples of 4 (at 2**25) and whose
    # scaled value is then 2.5 exactly: rounded once to even it reads 3 (and -3); adding in float32 (2**25 + 1
    # rounds to 2**25 first) reads 2 there, and adding in int32 wraps at the ends
    edges = np.array([-2 ** 31, 2 ** 31 - 1, 2 ** 24 + 1, -(2 ** 24) - 3, 2 ** 30 + 129, 0, 1, -1], np.int64)
    o = 8
    ties = np.array([[2 ** 25 + 1] * o, [-(2 ** 25) - 1] * o], np.int64)
    acc = np.concatenate([np.repeat(edges, o).reshape(-1, o), ties,
                          RNG.integers(-2 ** 31, 2 ** 31, (61, o))]).astype(np.int32)
    bias = np.concatenate([edges[:o - 2], [2 ** 23 - 3, RNG.integers(-2 ** 31, 2 ** 31)]]).astype(np.int32)
    acc[len(edges) + 1, 6] = -(2 ** 25) - 1 - 2 * (2 ** 23 - 3)  # with the same bias: the tie at -2.5 (reads -3)
    scale = np.full(o, 2.0 ** -24, np.float32)
    z = RNG.integers(-128, 128, acc.shape).astype(np.int8)
    z[len(edges):len(edges) + 2] = 0  # the ties stay ties when fused
    add_scale = np.full(o, 0.75 if fused else 0.0, np.float32)
    val = (acc.astype(np.int64) + bias).astype(np.float32) * scale + (z.astype(np.float32) * add_scale)
    out = np.empty(acc.shape, np.int8)
    bias_t, scale_t, add_t, *terms = loops.tiled(o, bias, scale, add_scale, *loops.epilogue_terms(
        o, 0, 1 if fused else 0, np.full(o, 127, np.int8)))
    if fused:
        loops.epilogue_add(acc, bias_t, scale_t, z, add_t, out, 0, acc.shape[0])
    else:
        loops.epilogue(acc, bias_t, scale_t, acc.reshape(-1).view(np.int8)[:acc.size].reshape(acc.shape), add_t,
                       *terms, out, 0, acc.shape[0])
    np.testing.assert_array_equal(out, float2int8(val))
    assert out[len(edges), 6] == 3 and out[len(edges) + 1, 6] == -3  # the ties above, as the reference rounds them


def _tie_conv():
    """A conv with a channel whose outputs oneDNN may round otherwise than TNN, and an input reaching that tie
    (test_channels_without_factor_are_recomputed)."""
    o, c = 16, 64
    w = _i8(o, c, 1, 1)
    w[3] = 127
    scale = RNG.uniform(0.0005, 0.003, o).astype(np.float32)
    scale[3] = 0.0008107082
    node = _qconv(o, c, 1, activation="relu", scale=scale, weight=w, unsigned=True)
    node.attrs["bias"][3] = 93
    x = _i8(2, 9, 8, c, lo=0)
    x[0, 0, 0] = 0
    x[0, 0, 0, :5], x[0, 0, 0, 5] = 127, 49
    return node, x


@pytest.mark.parametrize("fixups", [False, True])
def test_conv_called_again_on_the_same_arrays_reads_their_new_values(fixups):
    """The requant way's call remembers the last run's arrays (as the runtime passes the same arena views run after
    run): new values in them, other arrays, and another shape all give the reference's results, with the channels
    to recheck rechecked at every call."""
    node, first = _tie_conv() if fixups else (_qconv(16, 8, 3, pads=1, activation="relu", unsigned=True),
                                              _i8(2, 9, 8, 8, lo=0))
    c = first.shape[3]
    fn, ws = build_kernel(node, infos_of([first], node=node))
    assert next(iter(fn.plans.values())).way == "requant"
    assert bool(int8_kernels._SPECS[node].fixup.size) == fixups
    x, out = first.copy(), np.empty((2, 9, 8, 16), np.int8)
    for values in (first, _i8(2, 9, 8, c, lo=0), first):
        x[...] = values
        fn([x], [out], ws)
        np.testing.assert_array_equal(out, reference(node, [x])[0])
    if fixups:
        assert out[0, 0, 0, 3] == 71  # the tie, rounded away from zero at the third call too
    other = np.empty_like(out)
    fn([x], [other], ws)
    np.testing.assert_array_equal(other, reference(node, [x])[0])
    small = x[:1].copy()
    fn([small], [out[:1]], ws)
    np.testing.assert_array_equal(out[:1], reference(node, [small])[0])

def _impl(node, arrays):
    fn, _ = build_kernel(node, infos_of(arrays, node=node))
    return fn.impl


def _signed_depthwise_on_onednn() -> bool:
    """Whether oneDNN runs a depthwise conv of int8 (and zero-point u8) inputs on this CPU: with VNNI or AMX.
    Elsewhere they take the numba loops by design (conv._exact_signed: AVX2's vpmaddubsw saturates, and a dense
    conv's spread input would leave the depthwise kernels); dense convs take them on oneDNN everywhere."""
    node = _qconv(8, 8, 3, groups=8, pads=1, weight=np.ones((8, 1, 3, 3), np.int8))
    return _impl(node, [np.zeros((1, 2, 2, 8), np.int8)]).startswith("onednn:")


SIGNED_DEPTHWISE_ON_ONEDNN = available() and _signed_depthwise_on_onednn()


def test_strided_conv_that_skips_the_last_rows_stays_on_onednn():
    # a residual block's 1x1 stride-2 downsample of an even size never reads the last row and column
    node = _qconv(16, 8, 1, stride=2, unsigned=True)
    x = _i8(2, 10, 12, 8, lo=0)
    _check(node, [x])
    assert _impl(node, [x]).startswith("onednn:")


def _tie_scales(o: int, k: int) -> np.ndarray:
    """Factors s = (m + 0.5) / N with small N: many sums land exactly on a tie k + 0.5."""
    n = RNG.integers(3, 40, o)
    return ((RNG.integers(0, 60, o) + 0.5) / n).astype(np.float32)


@pytest.mark.parametrize("activation", [None, "relu", "relu6"])
def test_ties_round_away_from_zero_as_tnn(activation):
    node = _qconv(32, 16, 1, activation=activation, scale=_tie_scales(32, 16),
                  weight=RNG.integers(-2, 3, (32, 16, 1, 1)).astype(np.int8))
    node.attrs["bias"] = RNG.integers(-40, 40, 32).astype(np.int32)
    x = np.clip(_i8(1, 10, 10, 16), -3, 3)
    sums = np.einsum("nhwc,oc->nhwo", x.astype(np.int64), node.attrs["weight"][:, :, 0, 0].astype(np.int64))
    v = (sums + node.attrs["bias"]).astype(np.float32) * node.attrs["scale"]
    assert np.count_nonzero(np.abs(v - np.trunc(v)) == 0.5) > 50  # ties are there to be rounded
    _check(node, [x])
    assert _impl(node, [x]).endswith("/requant")


def test_channels_without_factor_are_recomputed():
    # Factor 0.0008107082 over sums 93 + 127 * (0 .. 64 * 127) reaches the tie 86961 * s = 70.5 and values an ulp
    # below other ties (found by searching random factors): neither one factor nor two chained ones fit it, so the
    # outputs oneDNN may round otherwise than TNN are recomputed after the primitive
    o, c = 16, 64
    w = _i8(o, c, 1, 1)
    w[3] = 127
    scale = RNG.uniform(0.0005, 0.003, o).astype(np.float32)
    scale[3] = 0.0008107082
    bias = RNG.integers(-3000, 3000, o).astype(np.int32)
    bias[3] = 93
    assert 3 in tie_free_scales(scale, w, bias, 1, None, True)[2]
    node = _qconv(o, c, 1, activation="relu", scale=scale, weight=w, unsigned=True)
    node.attrs["bias"] = bias
    x = _i8(2, 12, 12, c, lo=0)
    x[0, 0, 0] = 0
    x[0, 0, 0, :5], x[0, 0, 0, 5] = 127, 49  # inputs summing to 684: 93 + 127 * 684 = 86961, the tie
    assert np.float32(86961) * scale[3] == np.float32(70.5)
    assert reference(node, [x])[0][0, 0, 0, 3] == 71  # away from zero, where half to even gives 70
    _check(node, [x])
    assert _impl(node, [x]).endswith("/requant")
    spec = int8_kernels._SPECS[node]
    spec.fixup = spec.fixup[:0]  # without the recheck, oneDNN's own rounding shows
    assert run_kernel(node, [x])[0][0, 0, 0, 3] == 70


ZERO_POINT_CONVS = [
    dict(o=16, c=3, k=3, stride=2, pads=1, activation="relu"),  # the image's first conv
    dict(o=5, c=3, k=3, stride=2, pads=1),
    dict(o=6, c=4, k=3, groups=2, dilation=2, pads=2, activation="relu6"),
    dict(o=8, c=8, k=3, groups=8, pads=1),                     # depthwise
    dict(o=9, c=6, k=1),                                       # pointwise
    dict(o=5, c=4, k=1, fusion="add_then_act", activation="relu"),
]


@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("cfg", ZERO_POINT_CONVS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_conv_of_an_input_with_a_zero_point_is_bit_exact(cfg, onednn):
    """u8 inputs q + 128 (0 and 255 among them) give the int8 sums of q, on oneDNN and in the numba loops."""
    node = _qconv(**cfg, zero_point=128)
    device = cpu_device() if onednn else cpu_device(onednn=False)
    for n, h, w in ((2, 9, 8), (1, 6, 7)):
        x = _conv_inputs(node, n, cfg["c"], h, w)
        x[0] = RNG.integers(0, 256, x[0].shape).astype(np.uint8)
        x[0][0, 0, 0, 0], x[0][0, 0, 1, 0] = 0, 255
        for g, want in zip(run_kernel(node, x, device=device), reference(node, x), strict=True):
            np.testing.assert_array_equal(g, want)
    fn, _ = build_kernel(node, infos_of(x, node=node), device)
    depthwise = cfg.get("groups", 1) == cfg["c"] == cfg["o"]
    assert fn.impl.startswith("onednn:") == (onednn and (SIGNED_DEPTHWISE_ON_ONEDNN or not depthwise))


def test_zero_point_of_a_conv_is_taken_off_its_input():
    # the reference itself: u8 q + 128 stands for the int8 q
    node = _qconv(4, 3, 3, pads=1, zero_point=128)
    q = _i8(1, 5, 5, 3)
    shifted = (q.astype(np.int16) + 128).astype(np.uint8)
    plain = make_node("Int8ConvNhwc", 1, params={**node.params, "src_zero_point": 0}, attrs=node.attrs)
    np.testing.assert_array_equal(reference(node, [shifted])[0], reference(plain, [q])[0])



def test_channels_without_factor_are_recomputed_from_the_int8_values_of_an_input_with_a_zero_point():
    # test_channels_without_factor_are_recomputed's tie, on u8 inputs q + 128: the recheck reads the int8 q
    o, c = 16, 64
    w = _i8(o, c, 1, 1, lo=-127)
    w[3] = 127
    scale = RNG.uniform(0.0005, 0.003, o).astype(np.float32)
    scale[3] = 0.0008107082
    node = _qconv(o, c, 1, activation="relu", scale=scale, weight=w, zero_point=128)
    node.attrs["bias"][3] = 93
    q = _i8(2, 12, 12, c, lo=0)
    q[0, 0, 0] = 0
    q[0, 0, 0, :5], q[0, 0, 0, 5] = 127, 49  # 93 + 127 * 684 = 86961, the tie
    x = (q.astype(np.int16) + 128).astype(np.uint8)
    assert reference(node, [x])[0][0, 0, 0, 3] == 71
    _check(node, [x])
    assert _impl(node, [x]).endswith("/requant") and 3 in int8_kernels._SPECS[node].fixup

@pytest.mark.parametrize("zero_point", [0, 128])
def test_dense_conv_of_inputs_that_saturate_byte_pairs_is_exact_on_onednn(zero_point, monkeypatch):
    # Extreme inputs (u8 0 / 255, int8 -128 / 127, which oneDNN shifts to 0 / 255) beside weights of +-127: a pair
    # of neighbouring channels reaches 2 * 255 * 127 > 32767, which AVX2's vpmaddubsw saturates; there the input is
    # spread (conv.py) and summed exactly on oneDNN, as VNNI's kernels sum it
    w = RNG.choice(np.array([-127, 127], np.int8), (16, 6, 3, 3))
    node = _qconv(16, 6, 3, pads=1, activation="relu", weight=w, zero_point=zero_point)
    x = RNG.choice(np.array([0, 255] if zero_point else [-128, 127]), (2, 7, 9, 6)).astype(
        np.uint8 if zero_point else np.int8)
    _check(node, [x])
    fn, _ = build_kernel(node, infos_of([x], node=node))
    assert fn.impl.startswith("onednn:")
    if any(plan.spread for plan in fn.plans.values()):  # the same conv on the plain input is not exact here
        monkeypatch.setattr(int8_conv, "_spreadable", lambda spec, impl: False)
        monkeypatch.setattr(int8_conv, "_exact_signed", lambda impl: True)
        plain = make_node("Int8ConvNhwc", 1, params=node.params, attrs=node.attrs)
        assert not np.array_equal(run_kernel(plain, [x])[0], reference(plain, [x])[0])
        monkeypatch.undo()
        # a weight of -128 has no int8 negation for the spread: the exact loops
        w[0, 0, 0, 0] = -128
        odd = _qconv(16, 6, 3, pads=1, activation="relu", weight=w, zero_point=zero_point)
        _check(odd, [x])
        assert _impl(odd, [x]) == "numba:direct"


@pytest.mark.parametrize("k,stride,pads,images", [(3, 2, 1, 2), (7, 2, 3, 2), (1, 1, 0, 2), (3, 1, 1, 5)])
def test_spread_conv_in_bands_is_bit_exact(k, stride, pads, images, monkeypatch):
    # bands of a few rows (the first with the top padding, the last with the bottom one, and one row less where
    # the rows do not divide) image by image, runs of pixels (pointwise), or two whole images of five (the last
    # band one); a host without spreads runs it whole
    monkeypatch.setattr(int8_conv, "SPREAD_BAND_BYTES", 2 * 11 * 3 * (k + 2 * stride) if images == 2 else
                        2 * 17 * 11 * 3 * 2)
    node = _qconv(8, 3, k, stride=stride, pads=pads, activation="relu", zero_point=128)
    x = RNG.integers(0, 256, (images, 17, 11, 3)).astype(np.uint8)
    _check(node, [x])
    _check(node, [np.ascontiguousarray(x[:1, :13])], [x])
    fn, _ = build_kernel(node, infos_of([x], node=node))
    plan = fn.plans[x.shape]
    assert len(plan.bands) > 2 or not plan.spread


def test_sums_beyond_float_exactness_take_the_direct_loop():
    w = np.full((3, 1100, 1, 1), 127, np.int8)  # 128 * 1100 * 127 > 2**24
    node = _qconv(3, 1100, 1, weight=w, scale=np.full(3, 1e-6, np.float32))
    x = _i8(1, 2, 3, 1100)
    _check(node, [x])
    assert _impl(node, [x]) == "numba:direct"
    # u8 inputs with a zero point: sums of up to 255 * 520 * 127 > 2**24, where int8 inputs stay below
    node = _qconv(3, 520, 1, weight=np.full((3, 520, 1, 1), 127, np.int8), scale=np.full(3, 1e-5, np.float32),
                  zero_point=128)
    x = RNG.integers(0, 256, (1, 2, 3, 520)).astype(np.uint8)
    _check(node, [x])
    assert _impl(node, [x]) == "numba:direct"


def _brute_force_agrees(scale: float, first: float, second: float, lo: int, hi: int) -> bool:
    n = np.arange(lo, hi + 1, dtype=np.int64).astype(np.float32)
    want = float2int8(n * np.float32(scale)).astype(np.int32)
    got = np.rint(np.clip((n * np.float32(first)) * np.float32(second), -128, 127)).astype(np.int32)
    return bool(np.array_equal(want, got))


def test_tie_free_factors_hold_for_every_reachable_sum():
    o = 40
    scale = _tie_scales(o, 1) / np.float32(7.0)
    w = RNG.integers(-3, 4, (o, 2, 1, 1)).astype(np.int8)
    bias = RNG.integers(-50, 50, o).astype(np.int32)
    first, factors, unsolved = tie_free_scales(scale, w, bias)
    lo, hi = sum_range(w, bias)
    assert unsolved.size < o // 4  # those are recomputed by the kernel (test above)
    for c in set(range(o)) - set(unsolved.tolist()):
        assert _brute_force_agrees(scale[c], first[c], factors[c], int(lo[c]), int(hi[c])), c
    moved = np.flatnonzero((factors != scale) | (first != 1))
    assert moved.size  # the tie factors needed moving: unmoved, half to even would differ from TNN
    assert not any(_brute_force_agrees(scale[c], 1.0, scale[c], int(lo[c]), int(hi[c])) for c in moved)


def test_quantize_and_dequantize_nhwc():
    x = (RNG.standard_normal((2, 5, 6, 7)) * 4).astype(np.float32)
    scale = RNG.uniform(0.01, 0.05, 5).astype(np.float32)
    scale[2] = 0
    _check(make_node("Int8QuantizeNhwc", 1, attrs={"scale": scale}), [x])
    _check(make_node("Int8QuantizeNhwc", 1, attrs={"scale": scale[:1]}), [x])
    shifted = make_node("Int8QuantizeNhwc", 1, params={"zero_point": 128}, attrs={"scale": scale})
    _check(shifted, [x])
    np.testing.assert_array_equal(reference(shifted, [x])[0].astype(np.int16) - 128,
                                  reference(make_node("Int8QuantizeNhwc", 1, attrs={"scale": scale}), [x])[0])
    with pytest.raises(KernelError, match="zero point 0 or 128"):
        run_kernel(make_node("Int8QuantizeNhwc", 1, params={"zero_point": 3}, attrs={"scale": scale}), [x])
    q = _i8(2, 6, 7, 5)
    _check(make_node("Int8DequantizeNhwc", 1, attrs={"scale": scale}), [q], [_i8(3, 6, 7, 5)])
    for s in (scale, scale[:1]):  # per channel, per tensor
        _check(make_node("Int8DequantizeToNhwc", 1, attrs={"scale": s}), [q], [_i8(3, 6, 7, 5)])



def _force_regions(monkeypatch, request, threads_n: int) -> list[bool]:
    """Every split of the int8 kernels (NATIVE_QUANTIZE_ELEMENTS 0 too) on a native region over `threads_n`
    threads; returns the list of whether each region ran."""
    monkeypatch.setattr(int8_kernels, "NATIVE_QUANTIZE_ELEMENTS", 0)
    monkeypatch.setattr(int8_kernels, "NATIVE_JOIN_WORK", 0)
    return force_native_regions(monkeypatch, request, threads_n, int8_kernels)


def _dequantize_then_pool(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """What the two kernels the fused one stands for compute: Int8DequantizeNhwc, then GlobalAvgPool's."""
    dq = make_node("Int8DequantizeNhwc", 1, attrs={"scale": scale})
    (x,) = run_kernel(dq, [q])
    return run_kernel(make_node("GlobalAvgPool", 1), [x])[0]


@pytest.mark.parametrize("per_channel", [True, False])
def test_dequantize_mean_matches_the_reference_and_the_two_kernels(per_channel):
    """Int8DequantizeMeanNhwc (a dequantize whose only reader is a GlobalAvgPool) against the float64 reference
    (the float64 mean of the dequantized float32 values) bit for bit, and close to the two kernels it replaces
    (whose float32 sums differ in the last bits), at the max shape and below, 7x7 maps (MobileNetV2's, where a
    multiply by 1 / 49 rounded differently from the mean's division); a zero scale, saturated values; an empty map
    gives the reference's NaN means."""
    q = _i8(3, 7, 7, 37)
    q[0, 0, 0], q[1, :, :, 3] = -128, 127
    scale = RNG.uniform(0.001, 0.2, 37).astype(F32) if per_channel else F32([0.037])
    if per_channel:
        scale[5] = 0
    node = make_node("Int8DequantizeMeanNhwc", 1, attrs={"scale": scale})
    for arr in (q, q[:2, :4, :3].copy(), q[:1, :1, :1].copy()):
        (got,) = run_kernel(node, [arr], [q])
        assert got.shape == (arr.shape[0], 37, 1, 1) and got.dtype == F32
        np.testing.assert_array_equal(got, reference(node, [arr])[0])
        np.testing.assert_allclose(got, _dequantize_then_pool(arr, scale), rtol=1e-6, atol=1e-6)
    with np.errstate(invalid="ignore"):
        (empty,) = run_kernel(node, [q[:, :0]], [q])
    assert np.isnan(empty).all() and empty.shape == (3, 37, 1, 1)


@pytest.mark.parametrize("threads_n", [2, 3])
def test_dequantize_mean_split_and_recorded_gives_the_same_bits(threads_n, monkeypatch, request):
    """Its images split as a native region (the team forced on) and its records replayed: the bits of its
    one-thread Python run."""
    ran = _force_regions(monkeypatch, request, threads_n)
    q, scale = _i8(5, 6, 6, 40), RNG.uniform(0.01, 0.1, 40).astype(F32)
    node = make_node("Int8DequantizeMeanNhwc", 1, attrs={"scale": scale})
    want = np.empty((5, 40), F32)
    loops.dequantize_mean(q.reshape(5, 36, 40), scale, want, 0, 5)
    want = want.reshape(5, 40, 1, 1)
    fn, ws = build_kernel(node, infos_of([q], node=node))
    out = np.full((5, 40, 1, 1), 7, F32)
    fn([q], [out], ws)
    assert ran == [True]
    np.testing.assert_array_equal(out, want)
    out[...] = 7
    native = fn.native([q], [out], ws)
    assert [r[0] for r in native.records] == [N.OP_REGION]
    assert replay(native) is None
    np.testing.assert_array_equal(out, want)
    monkeypatch.setattr(threads, "MIN_WORK", q.size + 1)
    out[...] = 7
    native = fn.native([q], [out], ws)
    assert [r[0] for r in native.records] == [N.OP_CALL]
    assert replay(native) is None
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("trailing", [(2,), (4,), (3, 2)])
def test_dequantize_concat_joins_heads_per_image(trailing):
    """Detection heads dequantized into one joined value: each image's values of every head in order, heads
    whose sizes are not a whole number of the kernel's scale pattern, a per-tensor scale, a batch smaller than
    the planned one."""
    row = int(np.prod(trailing))
    heads = [_i8(2, 30, 40, row), _i8(2, 3, 5, 2 * row), _i8(2, 1, 1, row)]
    scales = [RNG.uniform(0.01, 0.05, h.shape[3]).astype(np.float32) for h in heads]
    scales[1] = scales[1][:1]
    node = make_node("Int8DequantizeConcatNhwc", 1, params={"trailing": list(trailing)}, attrs={"scales": scales})
    _check(node, heads, [np.zeros((3,) + h.shape[1:], np.int8) for h in heads])

@pytest.mark.parametrize("trailing", [(2,), (4,), (3, 2)])
def test_dequantize_concat_with_a_softmax_over_the_last_axis(trailing):
    """The join's softmax over the last axis (a pair: one exp; longer rows: exp(v - max) / sum), against the float64
    reference within float32 rounding: equal scores, differences from 0 to 25 (exp(-25) ~ 1e-11, no underflow to
    0), a batch smaller than the planned one."""
    row = int(np.prod(trailing))
    heads = [_i8(2, 30, 40, row), _i8(2, 3, 5, 2 * row)]
    heads[0][0, 0, 0, :] = 7  # every score of the row equal
    heads[0][0, 0, 1, :] = [127, -128] * (row // 2) if row % 2 == 0 else 127
    scales = [F32([0.1]), RNG.uniform(0.01, 0.05, 2 * row).astype(np.float32)]
    node = make_node("Int8DequantizeConcatNhwc", 1, params={"trailing": list(trailing), "softmax": True},
                     attrs={"scales": scales})
    for arrays in (heads, [h[:1] for h in heads]):
        want, got = reference(node, arrays)[0], run_kernel(node, arrays, heads)[0]
        assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=0)
        assert np.all(got > 0)


@pytest.mark.parametrize("threads_n", [2, 3])
@pytest.mark.parametrize("softmax", [False, True])
@pytest.mark.parametrize("trailing", [(2,), (4,), (3, 2)])
def test_dequantize_concat_split_and_recorded_gives_the_same_bits(trailing, softmax, threads_n, monkeypatch,
                                                                    request):
    """The join by rows of the output (loops.dequantize_concat_rows): on this thread, as a native region over 2-3
    threads whose shares start inside heads and inside their scale patterns, and replayed from its records (a
    region, or one call where it does not split): the same bits each way; the values the reference's (exactly
    without the softmax, within float32 rounding with it), a batch smaller than the planned one."""
    row = int(np.prod(trailing))
    heads = [_i8(3, 7, 9, row), _i8(3, 3, 5, 2 * row), _i8(3, 1, 1, 3 * row), _i8(3, 2, 1, row)]
    heads[0][0, 0, 0, :] = 127
    scales = [RNG.uniform(0.01, 0.05, h.shape[3]).astype(F32) for h in heads]
    scales[1] = scales[1][:1]
    node = make_node("Int8DequantizeConcatNhwc", 1, params={"trailing": list(trailing), "softmax": softmax},
                     attrs={"scales": scales})
    fn, ws = build_kernel(node, infos_of(heads, node=node))
    for arrays in (heads, [h[:2].copy() for h in heads]):
        want = reference(node, arrays)[0]
        alone = np.full(want.shape, 7, F32)
        monkeypatch.setattr(int8_kernels, "NATIVE_JOIN_WORK", 1 << 40)  # on this thread, one chunk
        monkeypatch.setattr(threads, "MIN_WORK", 1 << 40)
        fn(arrays, [alone], ws)
        if softmax:
            np.testing.assert_allclose(alone, want, rtol=2e-6, atol=0)
        else:
            np.testing.assert_array_equal(alone, want)
        assert [r[0] for r in fn.native(arrays, [alone], ws).records] == [N.OP_CALL]
        ran = _force_regions(monkeypatch, request, threads_n)
        for recorded in (False, True):
            out = np.full(want.shape, 7, F32)
            assert (replay(fn.native(arrays, [out], ws)) if recorded else fn(arrays, [out], ws)) is None
            np.testing.assert_array_equal(out, alone)
        assert ran == [True]
        assert [r[0] for r in fn.native(arrays, [alone], ws).records] == [N.OP_REGION]


@pytest.mark.parametrize("softmax", [False, True])
def test_dequantize_concat_split_over_python_where_regions_do_not_run(softmax, monkeypatch, request):
    """Where a split would not run as a native region (the team sleeping, or no OpenMP), the heads and the softmax
    split over the pool's Python callbacks, and nothing is recorded; the values the reference's."""
    cpu_device()
    before = threads.get_threads()
    request.addfinalizer(lambda: threads.set_threads(before))
    threads.set_threads(2)
    monkeypatch.setattr(threads, "MIN_WORK", 0)
    for module in (threads, int8_kernels):
        monkeypatch.setattr(module, "native_regions", lambda: False)
    monkeypatch.setattr(int8_kernels, "run_native", lambda *a: pytest.fail("no native region"))
    heads = [_i8(2, 5, 6, 2), _i8(2, 3, 5, 4)]
    scales = [RNG.uniform(0.01, 0.05, h.shape[3]).astype(F32) for h in heads]
    node = make_node("Int8DequantizeConcatNhwc", 1, params={"trailing": [2], "softmax": softmax},
                     attrs={"scales": scales})
    fn, ws = build_kernel(node, infos_of(heads, node=node))
    want = reference(node, heads)[0]
    out = np.full(want.shape, 7, F32)
    fn(heads, [out], ws)
    np.testing.assert_allclose(out, want, rtol=2e-6 if softmax else 0, atol=0)
    assert fn.native(heads, [out], ws) is None


@pytest.mark.parametrize("team", [0, 2, 3], ids=["python-split", "region-2", "region-3"])
@pytest.mark.parametrize("scales", [(0.01, 0.02, 0.03), (0.01, 0.0, 0.03), (0.015,)])
def test_quantize_of_three_channels_nhwc(scales, team, monkeypatch, request):
    """An image's three channels (a loop of their own where no scale is 0): odd sizes, saturation both ways, ties
    k + 0.5 (rounded away from zero), zeros of both signs; split as the Python path does or as a native region
    (loops.quantize_team, forced on over 2 and 3 threads)."""
    ran = _force_regions(monkeypatch, request, team) if team else []
    x = (RNG.standard_normal((2, 3, 5, 7)) * 2).astype(np.float32)
    edges = [0.0, -0.0, 1e30, -1e30, np.inf, -np.inf, 127.4, -128.6, 0.5, -0.5, 1.5, -2.5, 126.5, -127.5]
    for c, s in enumerate(np.broadcast_to(np.asarray(scales, np.float32), (3,))):
        s = s if s else np.float32(1)  # a channel of scale 0 quantizes everything to 0
        x[0, c, 0, :7] = np.float32(edges[:7]) * s
        x[1, c, 4, :7] = np.float32(edges[7:]) * s
    for params in ({}, {"zero_point": 128}):  # int8, or uint8 q + 128 for a first conv
        _check(make_node("Int8QuantizeNhwc", 1, params=params, attrs={"scale": np.asarray(scales, np.float32)}), [x],
               [np.zeros((3, 3, 6, 8), np.float32)])
    assert ran == ([True, True] if team else [])


def test_add_pool_concat_relu_nhwc():
    a, b = _i8(2, 5, 6, 7), _i8(2, 5, 6, 7)
    s = {k: RNG.uniform(0.01, 0.05, 7).astype(np.float32) for k in ("scale_a", "scale_b", "scale_out")}
    _check(make_node("Int8AddNhwc", 2, attrs=s), [a, b])
    _check(make_node("Int8AddNhwc", 2, params={"relu": True}, attrs=s), [a, b])  # a ReLU folded in: max(q, 0)
    for mode, ceil in (("max", False), ("avg", True), ("max", True)):
        node = make_node("Int8PoolNhwc", 1, params={"mode": mode, "kernel": (3, 3), "stride": (2, 2), "pads": (1, 1),
                                                     "ceil_mode": ceil})
        _check(node, [a])
    big = np.full((1, 4, 4, 3), -128, np.int8)
    _check(make_node("Int8PoolNhwc", 1, params={"mode": "max", "kernel": (2, 2), "stride": (2, 2)}), [big])
    c = _i8(2, 5, 6, 3)
    _check(make_node("Int8ConcatNhwc", 2, params={"axis": 1}), [a, c])
    per_tensor = {"scales": np.float32([0.03, 0.05]), "scale_out": np.float32([0.04])}
    _check(make_node("Int8ConcatNhwc", 2, params={"axis": 1}, attrs=per_tensor), [a, c])
    _check(make_node("TnnQRelu", 1), [a])


def test_add_with_an_output_scale_of_zero_saturates_as_the_reference():
    # the add's loop divides without numba's zero test (so that it vectorizes): a channel whose output scale is 0
    # gives +-inf there, saturated to 127 / -128 as in the reference, and no error
    a, b = _i8(2, 3, 4, 5, lo=1), _i8(2, 3, 4, 5, lo=1)
    a[0, 0, 0, 2], b[0, 0, 0, 2] = -100, 1
    s = {k: RNG.uniform(0.01, 0.05, 5).astype(np.float32) for k in ("scale_a", "scale_b", "scale_out")}
    s["scale_out"][2] = 0
    node = make_node("Int8AddNhwc", 2, attrs=s)
    with np.errstate(divide="ignore"):
        _check(node, [a, b])
    assert run_kernel(node, [a, b])[0][0, 0, 0, 2] == -128


def test_layout_copies():
    x = _i8(2, 3, 4, 5)
    _check(make_node("Int8ToNhwc", 1), [x])
    _check(make_node("Int8ToNchw", 1), [to_nhwc(x)])


def test_one_spec_per_node():
    node = _qconv(8, 8, 1)
    ins = infos_of([_i8(1, 4, 4, 8)], node=node)
    build_kernel(node, ins)
    assert node in int8_kernels._SPECS


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_softmax_rows_match_the_float64_softmax_with_infinities_and_nans(k):
    """The detector join's softmax (the pair shortcut included) against exp(v - max) / sum in float64, rows with
    +inf, -inf and NaN scores among ordinary ones: NaN exactly where the reference has NaN."""
    rng = np.random.default_rng(k)
    rows = [rng.normal(size=k) * 10 for _ in range(20)]
    for special in (np.inf, -np.inf, np.nan):
        for at in range(k):
            row = rng.normal(size=k)
            row[at] = special
            rows.append(row)
    rows += [np.full(k, np.inf), np.full(k, -np.inf), np.full(k, 80.0)]
    x = np.asarray(rows, np.float32)
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(x64 - x64.max(axis=1, keepdims=True))
        want = e / e.sum(axis=1, keepdims=True)
    got = x.copy()
    softmax_rows(got, 0, got.shape[0])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("op", ["TnnQuantize", "Int8QuantizeNhwc"])
def test_quantize_refuses_nan_and_saturates_infinities(op):
    # int8 has no NaN: the loops' float2int8 gave 0 for it, a number served for a NaN
    x = RNG.standard_normal((1, 3, 4, 5)).astype(np.float32)
    x[0, 0, 0, 0], x[0, 1, 2, 3] = np.inf, -np.inf
    node = make_node(op, 1, attrs={"scale": np.full(3, 0.02, np.float32)})
    q = run_kernel(node, [x])[0]
    np.testing.assert_array_equal(q, reference(node, [x])[0])
    assert q.max() == 127 and q.min() == -128  # as TNN saturates
    x[0, 2, 3, 4] = np.nan
    for fn in (run_kernel, reference):
        with pytest.raises(InputValueError, match=r"test:1: .*met a NaN, which int8 cannot represent"):
            fn(node, [x])


@pytest.mark.parametrize("team", [0, 2], ids=["python-split", "region"])
@pytest.mark.parametrize("scales", [(0.01, 0.02, 0.03), (0.01, 0.0, 0.03), (0.02, 0.0, 0.01, 0.05, 0.03)])
@pytest.mark.parametrize("where", ["first", "last", "middle"])
def test_quantize_nhwc_finds_a_nan_anywhere_in_its_pass(scales, where, team, monkeypatch, request):
    """The NaN check rides on the quantization's own pass (per row, over the team's split, from Python or as a
    native region): a NaN in any image, row or channel is refused, one in a channel of scale 0 too (it quantizes to
    0 but is still no number), and one at either end of a batch large enough to be split over threads."""
    ran = _force_regions(monkeypatch, request, team) if team else []
    c = len(scales)
    x = RNG.standard_normal((4, c, 64, 600)).astype(np.float32)  # past MIN_WORK: the rows split over the team
    at = {"first": (0, 0, 0, 0), "last": (3, c - 1, 63, 599), "middle": (2, 1, 31, 300)}[where]
    x[at] = np.nan
    node = make_node("Int8QuantizeNhwc", 1, attrs={"scale": np.asarray(scales, np.float32)})
    with pytest.raises(InputValueError, match=r"met a NaN, which int8 cannot represent"):
        run_kernel(node, [x])
    x[at] = np.float32(np.inf)  # no NaN: saturates, as the reference does
    np.testing.assert_array_equal(run_kernel(node, [x])[0], reference(node, [x])[0])
    assert ran == ([True, True] if team else [])


@pytest.mark.parametrize("team", [0, 2], ids=["one-thread", "region"])
@pytest.mark.parametrize("scales", [(0.01, 0.02, 0.03), (0.02, 0.0, 0.01, 0.05)], ids=["image", "zero-scale"])
def test_quantize_record_reads_the_array_rebound_before_each_replay(scales, team, monkeypatch, request):
    """A quantization of the caller's input recorded into native programs (native_rebound with the input among the
    caller's): its job's input word, rewritten before a replay as fused_calls.Segment does, makes the replay
    quantize that array, bit for bit the reference's, whichever array it is; the NaN check after the program refuses
    a NaN in the array of that run (its flags rewritten by every replay), and the next clean array passes it."""
    ran = _force_regions(monkeypatch, request, team) if team else []
    c = len(scales)
    node = make_node("Int8QuantizeNhwc", 1, attrs={"scale": np.asarray(scales, np.float32)})
    first = RNG.standard_normal((2, c, 40, 300)).astype(np.float32)
    fn, ws = build_kernel(node, infos_of([first], node=node))
    out = np.zeros(infer(node, [first])[0].shape, np.int8)
    ins = [first]  # the call's input list, where each run attaches the caller's array
    native = fn.native_rebound(ins, [out], ws, (0,))
    assert native is not None and len(native.rebinds) == 1 and len(native.after) == 1
    assert (N.OP_REGION in {r[0] for r in native.records}) == bool(team)
    (j, job, word), = native.rebinds
    assert j == 0 and job[word] == first.ctypes.data
    for k in range(3):
        x = RNG.standard_normal(first.shape).astype(np.float32) * (k + 1) * 50  # saturating ones too
        if k == 1:
            x[0, 0, 7, 11] = np.nan
        ins[0], job[word] = x, x.ctypes.data
        out[...] = 9
        assert replay(native) is None
        if k == 1:
            with pytest.raises(InputValueError, match=r"met a NaN, which int8 cannot represent"):
                native.after[0]()
            continue
        native.after[0]()
        np.testing.assert_array_equal(out, reference(node, [x])[0])
    # a quantization of an arena value (its input the same every run): the same records, nothing to rebind
    stable = fn.native([first], [out], ws)
    assert stable is not None and stable.rebinds == [] and replay(stable) is None
    np.testing.assert_array_equal(out, reference(node, [first])[0])
    assert fn.native_rebound([first.astype(np.float64)], [out], ws, (0,)) is None  # no record for another dtype
    assert fn.native_rebound([first[:, :, :, ::2]], [out[:, :, ::2]], ws, (0,)) is None  # nor a strided array
    assert ran == []  # replays only: no Python split ran


@pytest.mark.parametrize("fusion,activation,tiled", [("add_then_act", None, True), ("act_then_add", "relu6", True),
                                                     ("add_then_act", "relu", False), (None, "relu", False)])
@pytest.mark.parametrize("split", [False, True], ids=["one-thread", "team"])
def test_int32_way_replays_as_its_python_ran(fusion, activation, tiled, split, monkeypatch):
    """The int32 way recorded into a native program (its tiles' primitives as their last run bound them, each
    followed by the requantization of its sums, over the team where the Python path splits it): the replay writes
    what the Python path wrote, bit for bit, run after run; a tile not bound to these arrays yet gives no records."""
    if not available():
        pytest.skip("oneDNN is not installed: no int32 way")
    if split:
        if threads.pool_kind(threads.get_policy(), threads._openmp is not None) != "openmp":
            pytest.skip("our kernels do not split over OpenMP's team here (no oneDNN or the `short` policy)")
        monkeypatch.setattr(threads, "MIN_WORK", 0)
        monkeypatch.setattr(threads, "native_regions", lambda: True)
    if not tiled:
        monkeypatch.setattr(int8_conv, "TILE_BYTES", 1 << 30)  # one pass over the whole output
    node = _qconv(40, 24, 1, fusion=fusion, activation=activation)
    if fusion is None:  # no scales found and a bias no float32 holds exactly: the int32 way without an add
        monkeypatch.setattr(int8_conv, "scaled_factors", lambda *args: None)
        node.attrs["bias"][0] = (1 << 24) + 1
    arrays = _conv_inputs(node, 2, 24, 53, 51)
    fn, ws = build_kernel(node, infos_of(arrays, node=node))
    plan = next(iter(fn.plans.values()))
    assert plan.way == "int32" and bool(plan.tiles) == tiled
    out = np.full(infer(node, arrays)[0].shape, 7, np.int8)
    assert fn.native(arrays, [out], ws) is None  # no tile bound to these arrays before a run
    fn(arrays, [out], ws)
    want = out.copy()
    np.testing.assert_array_equal(want, reference(node, arrays)[0])
    native = fn.native(arrays, [out], ws)
    assert native is not None
    assert (N.OP_REGION in {r[0] for r in native.records}) == (split and threads.get_threads() > 1)
    for _ in range(2):
        out[...] = 7
        assert replay(native) is None
        np.testing.assert_array_equal(out, want)


def test_a_job_is_kept_for_the_very_inputs_and_output_it_was_made_for():
    """threads.LastJob, as the joined dequantize keeps its job: the same array objects (a list of them or a tuple)
    get the kept job; another output, another array in any place, another count, or the caller's list changed in
    place since, a new one."""
    last = threads.LastJob()
    a, b, out = np.zeros(2), np.zeros(3), np.zeros(5)
    made = []

    def make():
        made.append(np.zeros(1))
        return made[-1]

    ins = [a, b]
    first = last.get(ins, out, make)
    assert last.get([a, b], out, make) is first and last.get((a, b), out, make) is first and len(made) == 1
    assert last.get([a, b], np.zeros(5), make) is not first
    first = last.get(ins, out, make)
    ins[1] = np.zeros(3)  # the caller's list changed in place: the kept tuple still names the old array
    assert last.get(ins, out, make) is not first
    assert last.get([a], out, make) is not made[-2]
    x = np.zeros(4)
    one = last.get(x, out, make)
    assert last.get(x, out, make) is one and last.get([x], out, make) is not one
