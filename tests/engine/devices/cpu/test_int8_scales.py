"""The int8 convolution's requantization inside oneDNN (weight scales and a float bias, int8/scales.py) is TNN's.

Three layers of evidence: the factor search checked by enumerating every reachable sum against numpy's TNN
rounding (float2int8, engine/ops/quant.py); oneDNN's own arithmetic with weight scales checked against the model
scales.py proves things about (two roundings, half to even), on every sum of a range, for each kernel family; and
whole convolutions (depthwise, grouped, pointwise, ReLU / ReLU6, saturating) on the scaled way against the numpy
reference, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import build_kernel, infos_of, make_node, reference, run_kernel

from engine.devices.cpu.int8 import conv
from engine.devices.cpu.int8 import kernels as int8_kernels
from engine.devices.cpu.int8.requant import sum_range
from engine.devices.cpu.int8.scales import scaled_factors
from engine.devices.cpu.onednn.objects import available
from engine.ops.quant import float2int8, qconv_accumulate

F32 = np.float32
RNG = np.random.default_rng(11)
pytestmark = pytest.mark.skipif(not available(), reason="oneDNN is not installed")
ACTS = {None: 0, "relu": 1, "relu6": 2}


def _tnn(sums: np.ndarray, bias: int, s: float, act: int, top: int) -> np.ndarray:
    """TNN's int8 output for int64 sums of products (the numpy reference's arithmetic)."""
    val = (sums + bias).astype(F32) * F32(s)
    if act == 1:
        val = np.maximum(val, F32(0))
    q = float2int8(val).astype(np.int32)
    return np.clip(q, 0, top) if act == 2 else q


def _onednn(sums: np.ndarray, c: float, bb: float, act: int, top: int) -> np.ndarray:
    """oneDNN's int8 output with weight scale c and float bias bb: fl(fl(sum * c) + bb), the activation in float,
    saturation, rounding half to even."""
    val = sums.astype(F32) * F32(c) + F32(bb)
    if act:
        val = np.maximum(val, F32(0))
    if act == 2:
        val = np.minimum(val, F32(top))
    return np.rint(np.clip(val, F32(-128), F32(127))).astype(np.int32)


def _tie_scales(o: int) -> np.ndarray:
    """Factors s = (m + 0.5) / n with small n: many sums land exactly on a tie k + 0.5."""
    return ((RNG.integers(0, 60, o) + 0.5) / RNG.integers(3, 40, o)).astype(F32)


CHANNELS = [  # (scales, weight range, bias range, unsigned): ties, saturation both ways, large biases
    ("ties", lambda o: _tie_scales(o) / F32(7), 3, 50, False),
    ("ties-unsigned", lambda o: _tie_scales(o) / F32(5), 3, 50, True),
    ("saturating", lambda o: RNG.uniform(0.01, 0.05, o).astype(F32), 20, 3000, False),
    ("typical", lambda o: RNG.uniform(0.0005, 0.003, o).astype(F32), 127, 120000, False),
]


@pytest.mark.parametrize("act", [None, "relu", "relu6"])
@pytest.mark.parametrize("case", CHANNELS, ids=lambda c: c[0])
def test_scaled_factors_hold_for_every_reachable_sum(case, act):
    _, scales, w_max, b_max, unsigned = case
    o, a = 24, ACTS[act]
    scale = scales(o)
    w = RNG.integers(-w_max, w_max + 1, (o, 3, 1, 1)).astype(np.int8)
    bias = RNG.integers(-b_max, b_max + 1, o).astype(np.int32)
    tops = RNG.integers(0, 128, o).astype(np.int8)
    lo, hi = sum_range(w, bias, unsigned)
    solved = moved = 0
    for ch in range(o):  # one channel at a time: a layer is scaled only when all of its channels are
        found = scaled_factors(scale[ch:ch + 1], w[ch:ch + 1], bias[ch:ch + 1], a, tops[ch:ch + 1], unsigned)
        if found is None:
            continue
        solved += 1
        c, bb = found[0][0], found[1][0]
        sums = np.arange(lo[ch], hi[ch] + 1, dtype=np.int64) - bias[ch]  # every sum of products it can reach
        want = _tnn(sums, int(bias[ch]), scale[ch], a, int(tops[ch]))
        np.testing.assert_array_equal(_onednn(sums, c, bb, a, int(tops[ch])), want, err_msg=f"channel {ch}")
        naive = _onednn(sums, scale[ch], F32(bias[ch]) * scale[ch], a, int(tops[ch]))
        moved += not np.array_equal(naive, want)
    assert solved >= o * 3 // 4
    if case[0].startswith("ties"):
        assert moved  # s and fl(b * s) as they are would round some tie otherwise than TNN: the search matters


def _qconv(o, c, k, groups=1, stride=1, pads=0, activation=None, unsigned=False, scale=None, bias=None, tops=None,
           weight=None):
    attrs = {"weight": RNG.integers(-128, 128, (o, c // groups, k, k)).astype(np.int8) if weight is None else weight,
             "bias": RNG.integers(-3000, 3000, o).astype(np.int32) if bias is None else bias,
             "scale": RNG.uniform(0.0005, 0.003, o).astype(F32) if scale is None else scale,
             "relu6_max": RNG.integers(20, 120, o).astype(np.int8) if tops is None else tops}
    params = {"groups": groups, "stride": [stride, stride], "pads": [pads, pads], "dilation": [1, 1],
              "activation": activation, "fusion": None, "src_unsigned": unsigned}
    return make_node("Int8ConvNhwc", 1, params=params, attrs=attrs)


def _input(node, n, h, w, c):
    return RNG.integers(0 if node.params["src_unsigned"] else -128, 128, (n, h, w, c)).astype(np.int8)


def _sums(node, x):
    """Exact sums of products (no bias), NHWC, from the numpy reference's accumulation."""
    no_bias = np.zeros(node.attrs["weight"].shape[0], np.int32)
    plain = make_node("Int8ConvNhwc", 1, params=node.params, attrs={**node.attrs, "bias": no_bias})
    return qconv_accumulate(plain, x.transpose(0, 3, 1, 2)).transpose(0, 2, 3, 1)


def _spec(node, x):
    fn, _ = build_kernel(node, infos_of([x], node=node))
    return int8_kernels._SPECS[node], fn.impl


def _scaled_spec(node, x):
    """_spec, skipping where oneDNN picked, for this shape on this CPU, a kernel the scaled way never runs on: an
    AMX CPU's oneDNN takes AMX kernels for some shapes and AVX-512 VNNI ones for others (HOST_ISA reads one shape);
    its AMX layers take requant.py's factors, bit-exact all the same."""
    spec, impl = _spec(node, x)
    _skip_unless_scaled(spec, impl)
    return spec, impl


def _isa_of(impl: str) -> str:
    """The instruction set in a kernel's impl ("onednn:brgconv_1x1:avx512_core_amx/requant"), "" where it names
    none."""
    return impl.split("/")[0].partition(":")[2].partition(":")[2]


def _skip_unless_scaled(spec, impl: str) -> None:
    # only an instruction set the scaled way was never checked on (AMX's) skips: a kernel family of a checked one
    # that lost the scaled way (a oneDNN upgrade, a layer off oneDNN) must still fail the asserts below
    isa = _isa_of(impl)
    if spec.wei_scales is None and isa and isa not in conv.SCALED_ISAS:
        pytest.skip(f"oneDNN runs {impl} for this shape on this CPU: {isa} is not among conv.SCALED_ISAS")


def _host_isa() -> str | None:
    """The instruction set of this CPU's oneDNN int8 kernels ("avx512_core_vnni", "avx2", ...), None without
    the scaled way: only those of conv.SCALED_ISAS (AVX-512 VNNI, AVX2), whose stores were run against scales.py's
    model, take it; elsewhere (AMX) every layer takes requant.py's factors, bit-exact all the same (the bit-exact
    tests here and in test_int8_nhwc.py run on every CPU)."""
    node = _qconv(16, 16, 1, unsigned=True, weight=np.ones((16, 16, 1, 1), np.int8))
    _, impl = _spec(node, np.zeros((1, 2, 2, 16), np.int8))
    return _isa_of(impl) if int8_kernels._SPECS[node].wei_scales is not None else None


HOST_ISA = _host_isa() if available() else None
SCALED_HERE = HOST_ISA is not None
needs_scaled = pytest.mark.skipif(not SCALED_HERE, reason="this CPU's oneDNN int8 kernels are not among "
                                  "conv.SCALED_ISAS (AVX-512 VNNI, AVX2): no layer takes weight scales here")

KERNELS = [  # one per kernel family of oneDNN's that the scaled way runs on, its ISA, and the family it must be
    ("avx512_core_vnni", "brgconv_1x1", dict(o=48, c=32, k=1)),
    ("avx512_core_vnni", "brgconv", dict(o=16, c=8, k=3, pads=1)),
    ("avx512_core_vnni", "brdgmm_dw", dict(o=128, c=128, k=3, groups=128, pads=1, unsigned=True)),  # many channels
    ("avx512_core_vnni", "jit_int8", dict(o=32, c=32, k=3, groups=32, pads=1, unsigned=True)),  # depthwise, few
    ("avx512_core_vnni", "jit_int8", dict(o=32, c=32, k=3, groups=32, stride=2, pads=1)),  # strided, signed inputs
    ("avx512_core_vnni", "jit_int8", dict(o=16, c=3, k=3, stride=2, pads=1)),  # a first layer's
    ("avx2", "jit_uni_int8_1x1", dict(o=48, c=32, k=1)),  # signed inputs: spread (conv.py)
    ("avx2", "jit_uni_int8", dict(o=16, c=8, k=3, pads=1)),
    ("avx2", "jit_uni_int8", dict(o=128, c=128, k=3, groups=128, pads=1, unsigned=True)),  # depthwise
    ("avx2", "jit_uni_int8", dict(o=96, c=96, k=3, groups=96, stride=2, pads=1, unsigned=True)),  # strided
    ("avx2", "jit_uni_int8", dict(o=16, c=3, k=3, stride=2, pads=1)),  # a first layer's, spread
]


@needs_scaled
@pytest.mark.parametrize("isa,family,cfg", KERNELS,
                         ids=lambda c: c if isinstance(c, str) else "-".join(f"{k}{v}" for k, v in c.items()))
def test_onednn_rounds_scaled_sums_as_scales_py_models(isa, family, cfg):
    if isa != HOST_ISA:
        pytest.skip(f"a kernel of {isa}; this CPU's are {HOST_ISA}")
    # Weight scales and biases the search would never choose (ties everywhere, large biases): oneDNN's outputs are
    # still exactly rne(fl(fl(sum * c) + bias)) element by element, the model scales.py proves its pairs on, and
    # not TNN's rounding
    o = cfg["o"]
    small = RNG.integers(-4, 5, (o, cfg["c"] // cfg.get("groups", 1), cfg["k"], cfg["k"])).astype(np.int8)
    node = _qconv(**cfg, weight=small)  # small sums: every channel has a pair, so the layer takes the scaled way
    x = np.clip(_input(node, 2, 12, 12, cfg["c"]), -3, 3)  # small sums: results within int8, many of them ties
    spec, impl = _scaled_spec(node, x)
    assert spec.wei_scales is not None and impl.startswith(f"onednn:{family}:"), impl
    # even channels: dyadic scales and biases, so that many results are exact ties k + 0.5; odd: any floats
    spec.wei_scales[:] = np.where(np.arange(o) % 2, _tie_scales(o) / F32(64), (2 * RNG.integers(0, 4, o) + 1) / F32(16))
    spec.bias_f[:] = np.where(np.arange(o) % 2, RNG.uniform(-60, 60, o), RNG.integers(-240, 240, o) / 4 + 0.125)
    got = run_kernel(node, [x])[0].astype(np.int32)
    sums = _sums(node, x)
    c, bb = spec.wei_scales, spec.bias_f
    want = np.rint(np.clip(sums.astype(F32) * c + bb, -128, 127)).astype(np.int32)
    np.testing.assert_array_equal(got, want, err_msg=impl)
    away = float2int8(sums.astype(F32) * c + bb).astype(np.int32)
    assert np.count_nonzero(away != want) > 10  # ties were there, and oneDNN rounded them half to even


@needs_scaled
def test_onednn_rounds_the_scaled_product_before_adding_the_bias():
    # Scales and biases where one fused multiply-add, rounding once, gives another integer than fl(fl(s * c) + b)
    # for some sum s of 0..127 (the model scales.py proves its pairs on): oneDNN's outputs are the latter
    sums = np.arange(128)[:, None]
    found_c, found_b = [], []
    for _ in range(64):  # such pairs are rare (a few in 4096 draws): draw until there are 16
        c, b = RNG.uniform(0.05, 1.0, 4096).astype(F32), RNG.uniform(-60, 60, 4096).astype(F32)
        fused = np.rint(np.clip((sums * c.astype(np.float64) + b.astype(np.float64)).astype(F32), -128, 127))
        differ = np.any(np.rint(np.clip(sums.astype(F32) * c + b, -128, 127)) != fused, axis=0)
        found_c.extend(c[differ])
        found_b.extend(b[differ])
        if len(found_c) >= 16:
            break
    assert len(found_c) >= 16, "too few pairs where the two roundings differ"
    scales, biases = np.array(found_c[:16], F32), np.array(found_b[:16], F32)
    w = np.zeros((16, 8, 1, 1), np.int8)
    w[:, 0] = 1  # the sums are input channel 0: 0..127
    node = _qconv(16, 8, 1, unsigned=True, weight=w)
    x = np.broadcast_to(np.arange(128, dtype=np.int8).reshape(1, 8, 16, 1), (1, 8, 16, 8)).copy()
    spec, impl = _scaled_spec(node, x)
    assert spec.wei_scales is not None, impl
    spec.wei_scales[:], spec.bias_f[:] = scales, biases
    c, bb = spec.wei_scales, spec.bias_f
    s = x[..., :1].astype(np.int64)
    two = np.rint(np.clip(s.astype(F32) * c + bb, -128, 127))
    fused = np.rint(np.clip((s * c.astype(np.float64) + bb.astype(np.float64)).astype(F32), -128, 127))
    assert np.count_nonzero(two != fused) >= 16
    np.testing.assert_array_equal(run_kernel(node, [x])[0], two.astype(np.int8), err_msg=impl)


SCALED = [
    dict(o=32, c=32, k=3, groups=32, pads=1, activation="relu6", unsigned=True),            # depthwise, ReLU6
    dict(o=24, c=24, k=3, groups=24, stride=2, pads=1, activation="relu"),                  # depthwise, signed
    dict(o=12, c=8, k=3, groups=4, pads=1, activation="relu"),                              # grouped
    dict(o=16, c=8, k=1, groups=2),                                                         # grouped pointwise
    dict(o=40, c=24, k=1, activation="relu6", unsigned=True),                               # pointwise
    dict(o=40, c=24, k=1, activation="relu6", unsigned=True, tops=np.full(40, 50, np.int8)),  # one ceiling: clip
    dict(o=16, c=3, k=3, stride=2, pads=1),                                                 # first layer
]


@pytest.mark.parametrize("saturating", [False, True])
@pytest.mark.parametrize("cfg", SCALED, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items() if k != "tops"))
def test_scaled_convs_are_bit_exact(cfg, saturating):
    o = cfg["o"]
    # saturating: factors large enough that many outputs pass +-127 (and ReLU6's ceilings)
    scale = RNG.uniform(0.02, 0.06, o).astype(F32) if saturating else RNG.uniform(0.0005, 0.003, o).astype(F32)
    # weights of a trained layer's size (|w| <= 24): random full-range ones give sums no real layer reaches
    weight = RNG.integers(-24, 25, (o, cfg["c"] // cfg.get("groups", 1), cfg["k"], cfg["k"])).astype(np.int8)
    node = _qconv(**cfg, scale=scale, weight=weight)
    x = _input(node, 2, 9, 11, cfg["c"])
    spec, impl = _spec(node, x)
    # (AVX2 runs a grouped conv of signed inputs on oneDNN's reference, which takes the factors)
    if SCALED_HERE and conv.scaled_kernel(impl.removeprefix("onednn:").split("/")[0]):
        assert spec.wei_scales is not None and spec.fixup.size == 0, impl
        assert not any(op[0] == "binary" and op[1] == "mul" for op in spec.post_ops(o)[0])
    want = reference(node, [x])[0]
    if saturating:
        ceiling = np.where(cfg.get("activation") == "relu6", node.attrs["relu6_max"], 127)
        assert np.count_nonzero((want == -128) | (want == ceiling)) > want.size // 20
    np.testing.assert_array_equal(run_kernel(node, [x])[0], want)
    small = _input(node, 1, 6, 7, cfg["c"])  # below the max shape: a second primitive
    np.testing.assert_array_equal(run_kernel(node, [small], [x])[0], reference(node, [small])[0])


@pytest.mark.parametrize("activation", ["relu", "relu6"])
def test_a_layer_with_a_channel_the_scales_cannot_fit_keeps_the_factors(activation):
    # Channel 3 (the tie 86961 * s = 70.5 and values an ulp below other ties) has neither a scale pair nor a
    # factor pair: the layer takes requant.py's factors, and that channel's outputs are rechecked. ReLU6 with one
    # ceiling for the layer (100): a clip after the factors
    o, c = 16, 64
    w = RNG.integers(-128, 128, (o, c, 1, 1)).astype(np.int8)
    w[3] = 127
    scale = RNG.uniform(0.0005, 0.003, o).astype(F32)
    scale[3] = 0.0008107082
    bias = RNG.integers(-3000, 3000, o).astype(np.int32)
    bias[3] = 93
    assert scaled_factors(scale[3:4], w[3:4], bias[3:4], 1, None, True) is None
    node = _qconv(o, c, 1, activation=activation, unsigned=True, scale=scale, bias=bias, weight=w,
                  tops=np.full(o, 100, np.int8))
    x = _input(node, 2, 12, 12, c)
    x[0, 0, 0] = 0
    x[0, 0, 0, :5], x[0, 0, 0, 5] = 127, 49  # inputs summing to 684: 93 + 127 * 684 = 86961, the tie
    spec, impl = _spec(node, x)
    assert spec.wei_scales is None and 3 in spec.fixup
    assert (activation == "relu6") == (("clip", 0.0, 100.0) in spec.post_ops(o)[0])
    np.testing.assert_array_equal(run_kernel(node, [x])[0], reference(node, [x])[0])


@needs_scaled
def test_a_kernel_scales_py_does_not_hold_for_takes_the_factors(monkeypatch):
    # oneDNN picking a kernel whose arithmetic with weight scales was not checked (here: any): the plan drops the
    # scales for requant.py's factors, exact all the same
    monkeypatch.setattr(conv, "SCALED_IMPLS", ("none:",))
    node = _qconv(24, 16, 1, activation="relu", weight=RNG.integers(-24, 25, (24, 16, 1, 1)).astype(np.int8))
    x = _input(node, 2, 9, 11, 16)
    spec, impl = _spec(node, x)
    assert spec.wei_scales is None and spec.way == "requant", impl
    assert any(op[0] == "binary" and op[1] == "mul" for op in spec.post_ops(24)[0])
    np.testing.assert_array_equal(run_kernel(node, [x])[0], reference(node, [x])[0])


@needs_scaled
def test_a_smaller_input_whose_kernel_needs_more_workspace_runs_the_direct_loops(monkeypatch):
    # Built on the scaled way at the max shape (no room for int32 sums planned); a smaller input then gets a kernel
    # scales.py does not hold for (stand-in: none is listed), whose fallback, with a bias that is not a float32, is
    # the int32 way and its sums: that shape runs the exact numba loops instead of failing the request.
    node = _qconv(24, 16, 1, activation="relu", weight=RNG.integers(-3, 4, (24, 16, 1, 1)).astype(np.int8),
                  bias=np.full(24, 2 ** 24 + 1, np.int32), scale=RNG.uniform(1e-6, 2e-6, 24).astype(F32))
    big = _input(node, 2, 9, 11, 16)
    fn, ws = build_kernel(node, infos_of([big], node=node))
    spec = int8_kernels._SPECS[node]
    _skip_unless_scaled(spec, fn.impl)
    assert spec.wei_scales is not None and spec.way == "requant", fn.impl
    out = np.empty((2, 9, 11, 24), np.int8)
    fn([big], [out], ws)
    np.testing.assert_array_equal(out, reference(node, [big])[0])
    monkeypatch.setattr(conv, "SCALED_IMPLS", ("none:",))
    small = np.ascontiguousarray(big[:1, :5, :5])
    out = np.empty((1, 5, 5, 24), np.int8)
    fn([small], [out], ws)
    np.testing.assert_array_equal(out, reference(node, [small])[0])


def test_a_dilated_conv_on_a_narrow_input_runs_the_direct_loops():
    # oneDNN's scratchpad for a dilated 3x3 at width 1 is larger than at the max shape it was planned for
    node = _qconv(64, 64, 3, pads=2, activation="relu", unsigned=True)
    node.params["dilation"] = [2, 2]
    big = _input(node, 4, 24, 24, 64)
    fn, ws = build_kernel(node, infos_of([big], node=node))
    for n, h, w in ((4, 24, 24), (1, 5, 1), (4, 24, 1), (1, 1, 24)):
        x = np.ascontiguousarray(big[:n, :h, :w])
        want = reference(node, [x])[0]
        out = np.empty(want.shape, np.int8)
        fn([x], [out], ws)
        np.testing.assert_array_equal(out, want, err_msg=f"input {x.shape}")


def test_the_scaled_way_runs_only_on_kernels_and_isas_checked_bit_for_bit():
    # stores on other instruction sets (AMX's, AVX2 VNNI's) were never run against scales.py's model: the factors
    for impl in ("brgconv_1x1:avx512_core_vnni", "jit_int8:avx512_core_vnni", "jit_uni_int8:avx2",
                 "jit_uni_int8_1x1:avx2"):
        assert conv.scaled_kernel(impl), impl
    for impl in ("brgconv:avx2_vnni", "jit_uni_int8:avx2_vnni", "brgconv:avx512_core_amx", "gemm:any", "ref:any",
                 "brgconv_1x1:avx512_core", "jit_uni_int8:avx512_core"):
        assert not conv.scaled_kernel(impl), impl


def _cpu_has(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return flag in f.read().split()
    except OSError:
        return False


def test_amx_pays_only_for_dense_windows_with_long_sums():
    w = np.zeros
    for shape, groups, pays in [((64, 64, 3, 3), 1, True), ((64, 16, 3, 3), 1, False), ((64, 64, 1, 1), 1, False),
                                ((960, 960, 1, 1), 1, False), ((64, 1, 3, 3), 64, False), ((64, 32, 3, 3), 2, False)]:
        node = _qconv(shape[0], shape[1] * groups, shape[2], groups=groups, weight=w(shape, np.int8))
        assert conv._amx_pays(conv.QConvSpec(node, True)) == pays, (shape, groups)


@pytest.mark.skipif(not _cpu_has("amx_int8"), reason="this CPU has no AMX: oneDNN offers no AMX kernels here")
def test_amx_kernels_run_only_where_they_pay():
    dense = _qconv(64, 64, 3, pads=1, unsigned=True)
    if "amx" not in _spec(dense, _input(dense, 1, 28, 28, 64))[1]:
        pytest.skip("oneDNN offers no AMX kernel here (ONEDNN_MAX_CPU_ISA, or a kernel or VM without AMX's state)")
    # pointwise and depthwise convs take AVX-512 VNNI's kernels (and with them the scaled way where the scales fit:
    # HOST_ISA); a dense 3x3 of 64 channels (sums of 576) keeps AMX's
    pointwise = _qconv(64, 64, 1, unsigned=True)
    impl = _spec(pointwise, _input(pointwise, 1, 14, 14, 64))[1]
    assert "amx" not in impl and "vnni" in impl, impl
    depthwise = _qconv(128, 128, 3, groups=128, pads=1, unsigned=True)
    assert "amx" not in _spec(depthwise, _input(depthwise, 1, 14, 14, 128))[1]
