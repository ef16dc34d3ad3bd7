"""TNN's QuantizedUpsample on hand-made int8 models, against a reference written here from TNN's x86 int8 acc
(X86UpsampleLayerAcc::DoForward, X86UpsampleNearest2D / X86UpsampleBilinear2D) step by step in float32 scalars:
the factor in_scale / out_scale (0 below FLT_MIN), the byte copy when no factor is more than 1/128 from 1, the
nearest source index trunc(i * in / out), the bilinear coordinates and weights, TNN's rounding. Exact equality,
with oneDNN's NHWC int8 layout (Int8UpsampleNhwc) and without it (TnnQUpsample on NCHW values); and the layer
written back by the TNN writer reads and computes the same."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.devices.cpu.options import CpuOptions
from engine.errors import ModelFormatError, UnsupportedOpError
from engine.formats.tnn.writer.write import write_tnn
from engine.ops import OPS
from engine.runtime.options import EngineOptions
from tests.engine.formats.tnn.test_tnn_int8 import _conv_reference, quantized_model, round_away

RNG = np.random.default_rng(23)
F32 = np.float32
FLT_MIN = np.finfo(F32).tiny
S_X = F32([0.02, 0.03, 0.05])
LAYOUTS = {"nhwc": EngineOptions(cpu=CpuOptions(onednn=True)), "nchw": EngineOptions(cpu=CpuOptions(onednn=False))}


def _pick(s, c):
    return F32(s[0] if len(s) == 1 else s[c])


def tnn_x86_upsample(q, s_in, s_out, mode, align, oh, ow):
    """TNN's x86 int8 upsample of the NCHW int8 array q, element by element."""
    n, ch, ih, iw = q.shape
    fac = [_pick(s_in, c) / _pick(s_out, c) if _pick(s_out, c) >= FLT_MIN else F32(0) for c in range(ch)]
    do_scale = any(abs(float(f) - 1.0) > 0.0078125 for f in fac)
    if (ih, iw) == (oh, ow) and not do_scale:
        return q.copy()
    out = np.zeros((n, ch, oh, ow), np.int8)

    def finish(v, c):
        return int(round_away(F32(v) * fac[c] if do_scale else F32(v)))

    if mode == 1:
        hs, ws = F32(ih) / F32(oh), F32(iw) / F32(ow)
        for b, c, y, x in np.ndindex(out.shape):
            v = q[b, c, int(F32(y) * hs), int(F32(x) * ws)]
            out[b, c, y, x] = finish(v, c) if do_scale else v
        return out

    def coords(n_in, n_out):
        if align:
            r = F32(n_in - 1) / F32(n_out - 1) if n_out > 1 else F32(0)
            return [F32(i) * r for i in range(n_out)]
        r = F32(n_in) / F32(n_out) if n_out > 1 else F32(0)
        return [max(F32(float(r) * (i + 0.5) - 0.5), F32(0)) for i in range(n_out)]

    hc, wc = coords(ih, oh), coords(iw, ow)
    for b, c, y, x in np.ndindex(out.shape):
        h1, w1 = int(hc[y]), int(wc[x])
        h1p, w1p = int(h1 < ih - 1), int(w1 < iw - 1)
        h1l, w1l = F32(hc[y] - F32(h1)), F32(wc[x] - F32(w1))
        h0l, w0l = F32(1) - h1l, F32(1) - w1l
        p = [F32(q[b, c, h1 + dy, w1 + dx]) for dy in (0, h1p) for dx in (0, w1p)]
        v = (p[0] * w0l + p[1] * w1l) * h0l + (p[2] * w0l + p[3] * w1l) * h1l
        out[b, c, y, x] = finish(v, c)
    return out


def _run(tmp_path, layer, s_in, s_out, layout, shape=(1, 3, 5, 5), amp=3.0):
    n, c, h, w = shape
    model = quantized_model(tmp_path, [layer], [], {"x": s_in, "y": s_out}, inputs=f"x 4 {n} {c} {h} {w}")
    x = (RNG.standard_normal(shape) * amp).astype(F32)
    s_in_c = np.broadcast_to(s_in, (c,)).reshape(1, c, 1, 1)
    q = round_away(x / s_in_c)
    inst = model.instance(options=LAYOUTS[layout])
    want_op = "Int8UpsampleNhwc" if layout == "nhwc" else "TnnQUpsample"
    assert want_op in [nd.op_type for nd in inst.graph.nodes]
    return q, inst.run({"x": x})["y"]


def _dequantized(q, s_out):
    return q.astype(F32) * np.broadcast_to(s_out, (q.shape[1],)).reshape(1, -1, 1, 1)


CASES = [
    # layer params, in scales, out scales, (mode, align, oh, ow), input shape
    ("1 2 2 0", S_X, F32([0.04]), (1, 0, 10, 10), (1, 3, 5, 5)),  # per channel -> per tensor: rescaled
    ("1 0 0 0 7 9", F32([0.03]), F32([0.03]), (1, 0, 7, 9), (1, 3, 5, 5)),  # explicit size: bytes copied
    ("1 0.6 0.6 0", S_X, S_X, (1, 0, 3, 3), (1, 3, 5, 5)),  # downsampling
    ("1 1.5 1.5 0", S_X, F32([0.01, 0.03, 0.2]), (1, 0, 8, 8), (1, 3, 5, 5)),  # round(7.5) = 8; saturates
    ("1 2 3 0", S_X, S_X * F32(1.005), (1, 0, 10, 15), (1, 3, 5, 5)),  # within 1/128 of 1: bytes copied
    ("1 1 1 0", S_X, F32([0.04]), (1, 0, 5, 5), (1, 3, 5, 5)),  # same size, rescaled
    ("1 2 2 0", S_X, F32([0.04, 0.0, 1e-40]), (1, 0, 10, 10), (1, 3, 5, 5)),  # zero / denormal out scale: 0
    ("1 2 2 0", S_X, F32([-0.04]), (1, 0, 10, 10), (1, 3, 5, 5)),  # negative out scale: TNN's guard gives 0
    ("1 2 2 0", S_X, F32([0.03]), (1, 0, 8, 6), (2, 3, 4, 3)),  # batch 2
    ("2 2 2 0", S_X, F32([0.03, 0.02, 0.06]), (2, 0, 10, 10), (1, 3, 5, 5)),  # bilinear, half pixel
    ("2 0 0 0 20 10", S_X, F32([0.05]), (2, 0, 20, 10), (1, 3, 5, 5)),  # 4x and 2x by size
    ("2 0 0 1 9 9", S_X, F32([0.03]), (2, 1, 9, 9), (1, 3, 5, 5)),  # align_corners: 4 / 8 steps
    ("2 2 2 -1", S_X, F32([0.03]), (2, 0, 10, 10), (1, 3, 5, 5)),  # align_corners chosen: 0 (scales >= 1)
    ("2 0.5 0.5 0", S_X, S_X, (2, 0, 4, 4), (1, 3, 8, 8)),  # downsampling, no rescale
    ("2 1 1 0", S_X, F32([0.07]), (2, 0, 5, 5), (1, 3, 5, 5)),  # same size, rescaled
    ("2 2 2 0", S_X, F32([0.01]), (2, 0, 6, 4), (2, 3, 3, 2)),  # batch 2, saturating
]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("params, s_in, s_out, geometry, shape", CASES,
                         ids=[f"{c[0].replace(' ', '_')}-{i}" for i, c in enumerate(CASES)])
def test_int8_upsample_matches_tnn_x86(tmp_path, layout, params, s_in, s_out, geometry, shape):
    q, got = _run(tmp_path, f"QuantizedUpsample u 1 1 x y {params}", s_in, s_out, layout, shape)
    expected = tnn_x86_upsample(q, s_in, s_out, *geometry)
    np.testing.assert_array_equal(got, _dequantized(expected, s_out))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_conv_upsample_conv_chain_stays_int8(tmp_path, layout):
    w1 = RNG.integers(-127, 128, (4, 3, 3, 3), dtype=np.int8)
    w2 = RNG.integers(-127, 128, (2, 4, 1, 1), dtype=np.int8)
    b1, b2 = RNG.integers(-500, 500, 4).astype(np.int32), RNG.integers(-500, 500, 2).astype(np.int32)
    ws1, ws2 = F32([0.011, 0.02, 0.005, 0.03]), F32([0.01, 0.02])
    scales = {"x": S_X, "a": F32([0.2, 0.3, 0.25, 0.1]), "b": F32([0.15]), "y": F32([0.5, 0.4])}
    layers = ["QuantizedConvolution c1 1 1 x a 1 3 4 3 3 1 1 1 1 1 -1 1 1 0",
              "QuantizedUpsample u 1 1 a b 2 2 2 0",
              "QuantizedConvolution c2 1 1 b y 1 4 2 1 1 1 1 0 0 1 -1 1 1 0"]
    model = quantized_model(tmp_path, layers, [("Convolution", "c1", ["c1", 1, w1, b1, ws1]),
                                               ("Convolution", "c2", ["c2", 1, w2, b2, ws2])], scales)
    inst = model.instance(options=LAYOUTS[layout])
    ops = [n.op_type for n in inst.graph.nodes]
    if layout == "nhwc":  # int8 NHWC from the first conv to the last: no layout change in between
        assert ops == ["Int8QuantizeNhwc", "Int8ConvNhwc", "Int8UpsampleNhwc", "Int8ConvNhwc", "Int8DequantizeNhwc"]
    else:
        assert ops == ["TnnQuantize", "TnnQConv", "TnnQUpsample", "TnnQConv", "TnnDequantize"]
    x = RNG.standard_normal((1, 3, 5, 5)).astype(F32) * 3
    q = round_away(x / S_X.reshape(1, 3, 1, 1))
    a = round_away(_conv_reference(q, w1, b1, 1).astype(F32) * (ws1 / scales["a"]).reshape(1, 4, 1, 1))
    b = tnn_x86_upsample(a, scales["a"], scales["b"], 2, 0, 10, 10)
    y = round_away(_conv_reference(b, w2, b2, 0).astype(F32) * (ws2 / scales["y"]).reshape(1, 2, 1, 1))
    np.testing.assert_array_equal(inst.run({"x": x})["y"], _dequantized(y, scales["y"]))


def _load(tmp_path, layer, scales=None, inputs="x 4 1 3 5 5"):
    scales = {"x": S_X, "x1": S_X, "y": F32([0.02])} | (scales or {})
    return quantized_model(tmp_path, ["QuantizedReLU r 1 1 x x1", layer], [], scales, inputs=inputs)


@pytest.mark.parametrize("layer, scales, inputs, words", [
    ("QuantizedUpsample odd 1 1 x1 y 3 2 2 0", {}, None, "mode 3 (cubic"),
    ("QuantizedUpsample odd 1 1 x1 y 4 2 2 0", {}, None, "mode 4"),
    ("QuantizedUpsample odd 1 1 x1 y 2 3 3 0", {}, None, "bilinear height 5 -> 15"),
    ("QuantizedUpsample odd 1 1 x1 y 2 0 0 1 10 10", {}, None, "1/128 grid"),
    ("QuantizedUpsample odd 1 1 x1 y 2 0 0 0 10 7", {}, None, "bilinear width 5 -> 7"),
    ("QuantizedUpsample odd 1 1 x1 y 1 2 2 0", {"y": F32([0.02, 0.03])}, None, "2 output scale(s) for 3"),
    ("QuantizedUpsample odd 1 1 x1 y 1 2 2 0", {"y": F32([np.inf])}, None, "non-finite output scale"),
    ("QuantizedUpsample odd 1 1 x1 y 1 2 2 0", {"x1": F32([1e30]), "y": F32([1e-30])}, None, "non-finite"),
    ("QuantizedUpsample odd 2 1 x1 x y 1 2 2 0", {}, None, "scale or size inputs"),
    ("QuantizedUpsample odd 1 1 x1 y 1 2 2 0", {}, "x 3 1 3 5", "4-D"),
])
def test_int8_upsample_tnn_cannot_run_exactly_is_refused_with_file_and_line(tmp_path, layer, scales, inputs,
                                                                            words):
    with pytest.raises(UnsupportedOpError) as e:
        _load(tmp_path, layer, scales, inputs or "x 4 1 3 5 5")
    assert "QuantizedUpsample" in str(e.value) and "odd" in str(e.value) and "q.tnnproto:7" in str(e.value)
    assert words in str(e.value)


@pytest.mark.parametrize("layer, words", [
    ("QuantizedUpsample odd 1 1 x1 y 1", "parameter 1 is missing"),
    ("QuantizedUpsample odd 1 1 x1 y 1 two 2 0", "parameter 1 should be a number"),
    ("QuantizedUpsample odd 1 1 x1 y 1 2 2 0 0 5", "output size 0x5"),
    ("QuantizedUpsample odd 1 1 x1 y 1 0 0 0", "0x0 output"),
    ("QuantizedUpsample odd 1 1 x1 y 1 0.05 2 0", "0x10 output"),
])
def test_malformed_int8_upsample_params_name_file_and_line(tmp_path, layer, words):
    with pytest.raises(ModelFormatError) as e:
        _load(tmp_path, layer)
    assert "odd" in str(e.value) and "q.tnnproto" in str(e.value) and ":7" in str(e.value)
    assert words in str(e.value)


@pytest.mark.parametrize("layer, words", [
    ("QuantizedUpsample odd 1 1 x1 y 1 1000000 1000000 0", "more than 2147483647 elements"),
    ("QuantizedUpsample odd 1 1 x1 y 2 1000000 1000000 0", "more than 2147483647 elements"),
    ("QuantizedUpsample odd 1 1 x1 y 2 0 0 0 3000000000 1", "output size 3000000000x1 (TNN's dims are C ints"),
    ("QuantizedUpsample odd 1 1 x1 y 1 0 0 0 200000000 8", "more than 2147483647 elements"),
])
def test_int8_upsample_size_past_tnn_c_ints_names_file_and_line(tmp_path, layer, words):
    """TNN's dims and element counts are C ints: a hostile size or scale is refused at load, with its line."""
    with pytest.raises(ModelFormatError) as e:
        _load(tmp_path, layer, {"x": F32([0.02]), "x1": F32([0.02])}, "x 4 1 4 4 4")
    assert "odd" in str(e.value) and "q.tnnproto" in str(e.value) and ":7" in str(e.value)
    assert words in str(e.value)


@pytest.mark.parametrize("align", [0, 1])
def test_int8_bilinear_to_a_huge_size_is_refused_without_allocating_its_length(tmp_path, align):
    """4 -> 400000000 rows (1.6e9 output elements, within C ints): the 1/128-grid check looks at a sample, then
    chunks, of the coordinates, never at arrays of 400000000 float64s (a bare MemoryError before)."""
    layer = f"QuantizedUpsample odd 1 1 x1 y 2 0 0 {align} 400000000 1"
    with pytest.raises(UnsupportedOpError) as e:
        _load(tmp_path, layer, {"x": F32([0.02]), "x1": F32([0.02])}, "x 4 1 4 4 4")
    assert "odd" in str(e.value) and "q.tnnproto:7" in str(e.value) and "4 -> 400000000" in str(e.value)


def _random_case(rng):
    """A random mode, size, alignment and pair of blob scales whose bilinear weights stay on TNN's exact grid."""
    mode, align = int(rng.integers(1, 3)), int(rng.integers(0, 2))
    while True:
        ih, iw = (int(v) for v in rng.integers(1, 7, 2))
        oh, ow = (int(v) for v in rng.integers(1, 13, 2))
        if mode == 1 or all(F32(2 ** 7) * F32(lw) == np.round(F32(2 ** 7) * F32(lw)) for lw in
                            _weights(ih, oh, align) + _weights(iw, ow, align)):
            break
    s_in = (rng.uniform(0.01, 0.1, int(rng.choice([1, 3])))).astype(F32)
    s_out = (rng.uniform(0.01, 0.1, int(rng.choice([1, 3])))).astype(F32)
    return mode, align, (int(rng.integers(1, 3)), 3, ih, iw), (oh, ow), s_in, s_out


def _weights(n_in, n_out, align):
    """The l1 weights of TNN's bilinear coordinates on one axis (as tnn_x86_upsample computes them)."""
    if align:
        r = F32(n_in - 1) / F32(n_out - 1) if n_out > 1 else F32(0)
        coords = [F32(i) * r for i in range(n_out)]
    else:
        r = F32(n_in) / F32(n_out) if n_out > 1 else F32(0)
        coords = [max(F32(float(r) * (i + 0.5) - 0.5), F32(0)) for i in range(n_out)]
    return [c - F32(int(c)) for c in coords]


@pytest.mark.parametrize("seed", range(8))
def test_random_int8_upsamples_match_tnn_x86_in_both_layouts_and_the_op_reference(tmp_path, seed):
    rng = np.random.default_rng(100 + seed)
    mode, align, shape, (oh, ow), s_in, s_out = _random_case(rng)
    n, c, h, w = shape
    layer = f"QuantizedUpsample u 1 1 x y {mode} 0 0 {align} {oh} {ow}"
    model = quantized_model(tmp_path, [layer], [], {"x": s_in, "y": s_out}, inputs=f"x 4 {n} {c} {h} {w}")
    x = (rng.standard_normal(shape) * 4).astype(F32)
    q = round_away(x / np.broadcast_to(s_in, (c,)).reshape(1, c, 1, 1))
    expected = tnn_x86_upsample(q, s_in, s_out, mode, align, oh, ow)
    node = next(nd for nd in model.graph.nodes if nd.op_type == "TnnQUpsample")
    np.testing.assert_array_equal(OPS["TnnQUpsample"].reference(node, [q])[0], expected)
    for options in LAYOUTS.values():
        got = model.instance(options=options).run({"x": x})["y"]
        np.testing.assert_array_equal(got, _dequantized(expected, s_out))


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("params, s_y", [
    ("2 2 2 0", F32([0.03])),                 # bilinear by scales, per-tensor output scale
    ("1 2 1.5 -1", F32([0.05, 0.02, 0.04])),  # nearest, align chosen at load, per-channel
    ("2 0 0 1 9 9", F32([0.02])),             # bilinear to a size, align_corners
    ("2 1 1 0", F32([0.02])),                 # same size, rescaled
])
def test_int8_upsample_written_back_reads_and_computes_the_same(tmp_path, params, s_y, version):
    model = quantized_model(tmp_path, [f"QuantizedUpsample u 1 1 x y {params}"], [], {"x": S_X, "y": s_y})
    assert model.op_counts().get("TnnQUpsample") == 1
    proto, _ = write_tnn(model.graph, tmp_path / f"again{version}", version=version)
    assert "QuantizedUpsample u " in proto.read_text()
    again = engine.load(proto)
    assert again.op_counts() == model.op_counts()
    (node,) = [n for n in again.graph.nodes if n.op_type == "TnnQUpsample"]
    (orig,) = [n for n in model.graph.nodes if n.op_type == "TnnQUpsample"]
    assert node.params == orig.params
    np.testing.assert_array_equal(node.attrs["out_scale"], orig.attrs["out_scale"])
    np.testing.assert_array_equal(node.attrs["in_scale"], orig.attrs["in_scale"])
    x = RNG.standard_normal((1, 3, 5, 5)).astype(F32) * 3
    got = again.instance().run({"x": x})["y"]
    np.testing.assert_array_equal(got, model.instance().run({"x": x})["y"])
    q = round_away(x / S_X.reshape(1, 3, 1, 1))
    p = params.split()
    oh, ow = (int(p[4]), int(p[5])) if len(p) == 6 else tuple(int(np.floor(5 * float(v) + 0.5)) for v in p[1:3])
    align = int(p[3]) if int(p[3]) >= 0 else 0
    expected = tnn_x86_upsample(q, S_X, s_y, int(p[0]), align, oh, ow)
    np.testing.assert_array_equal(got, _dequantized(expected, s_y))
