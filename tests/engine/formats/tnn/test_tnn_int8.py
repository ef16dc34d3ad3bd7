"""TNN int8 semantics on hand-made quantized models, against step-by-step references written here.

The references follow TNN's CPU kernels as documented in engine/ops/quant.py: quantize x/scale with
round-half-away-from-zero and saturation, exact int32 accumulation, float32 requantization, one rounding.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import engine
from engine.errors import ModelFormatError
from engine.formats.tnn.serializer import Serializer
from engine.ops.quant import float2int8

RNG = np.random.default_rng(11)
F32 = np.float32


def round_away(v) -> np.ndarray:
    """Reference rounding, element by element in Python: half away from zero, saturate to int8."""
    out = [max(-128, min(127, int(np.trunc(np.float32(x) + np.float32(0.5 if x >= 0 else -0.5))))) for x in
           np.asarray(v, F32).ravel()]
    return np.array(out, np.int8).reshape(np.shape(v))


def quantized_model(tmp_path: Path, layers: list[str], resources: list, scales: dict[str, np.ndarray],
                    inputs: str = "x 4 1 3 5 5", outputs: str = "y") -> engine.Model:
    records = ["1 0 1 4206624772", inputs, " ", outputs, f" {len(layers)}", *layers]
    (tmp_path / "q.tnnproto").write_text("".join(f'"{r} ,"\n' for r in records))
    s = Serializer(2)
    s.u32(s.magic), s.i32(len(resources) + len(scales))
    for ltype, name, items in resources:
        s.i32(1), s.string(ltype), s.string(name)
        for item in items:
            s.string(item) if isinstance(item, str) else s.i32(item) if isinstance(item, int) else s.raw(item)
    for blob, scale in scales.items():
        s.i32(600), s.string("BlobScale"), s.string(f"{blob}_scale_data_")
        s.raw(np.asarray(scale, F32)), s.raw(np.zeros(np.size(scale), np.int32))
    (tmp_path / "q.tnnmodel").write_bytes(s.getvalue())
    return engine.load(tmp_path / "q.tnnproto")


def test_float2int8_rounds_half_away_and_saturates():
    vals = F32([0.5, -0.5, 1.4999999, 2.5, -2.5, 126.6, 127.5, 300, -128.4, -1000, 0.49999997, -0.0])
    # 0.49999997f + 0.5f rounds to 1.0f in float32, as it does in TNN's C++
    np.testing.assert_array_equal(float2int8(vals), [1, -1, 1, 3, -3, 127, 127, 127, -128, -128, 1, 0])
    np.testing.assert_array_equal(float2int8(vals), round_away(vals))


def _conv_reference(q: np.ndarray, w: np.ndarray, bias: np.ndarray, pad: int, groups: int = 1) -> np.ndarray:
    """int32 accumulation by explicit loops (independent of the engine's im2col)."""
    if groups > 1:
        cg, og = q.shape[1] // groups, w.shape[0] // groups
        return np.concatenate([_conv_reference(q[:, k * cg:(k + 1) * cg], w[k * og:(k + 1) * og],
                                               bias[k * og:(k + 1) * og], pad) for k in range(groups)], axis=1)
    n, c, h, wd = q.shape
    o, _, kh, kw = w.shape
    qp = np.pad(q.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    acc = np.zeros((n, o, oh, ow), np.int64)
    for i in range(oh):
        for j in range(ow):
            patch = qp[:, :, i:i + kh, j:j + kw]
            acc[:, :, i, j] = np.tensordot(patch, w.astype(np.int64), axes=([1, 2, 3], [1, 2, 3]))
    return acc + bias.reshape(1, -1, 1, 1)


@pytest.mark.parametrize("groups", [1, 3])
def test_quantized_conv_with_relu(tmp_path, groups):
    oc, icg = (4, 3) if groups == 1 else (3, 1)  # dense, then depthwise
    w = RNG.integers(-127, 128, (oc, icg, 3, 3), dtype=np.int8)
    bias = RNG.integers(-500, 500, oc).astype(np.int32)
    w_scale, s_out = F32([0.011, 0.02, 0.005, 0.03][:oc]), F32([0.2, 0.3, 0.25, 0.1][:oc])
    s_in = F32([0.05, 0.04, 0.03])
    layer = f"QuantizedConvolution c 1 1 x y {groups} {icg} {oc} 3 3 1 1 1 1 1 -1 1 1 1"
    model = quantized_model(tmp_path, [layer], [("Convolution", "c", ["c", 1, w, bias, w_scale])],
                            {"x": s_in, "y": s_out})
    x = RNG.standard_normal((1, 3, 5, 5)).astype(F32) * 3
    got = model.instance().run({"x": x})["y"]
    q = round_away(x / s_in.reshape(1, 3, 1, 1))
    acc = _conv_reference(q, w, bias, 1, groups)
    val = np.maximum(acc.astype(F32) * (w_scale / s_out).reshape(1, oc, 1, 1), 0)
    expected = round_away(val).astype(F32) * s_out.reshape(1, oc, 1, 1)  # dequantized at the graph output
    np.testing.assert_array_equal(got, expected)


def test_quantized_conv_relu6_ceiling_comes_from_the_output_scale(tmp_path):
    """A loaded layer stores only the file's scales; its factors (w_scale / s_out) and int8 ReLU6 ceilings
    (round(6 / s_out)) are derived from them as TNN's layer setup does."""
    w = RNG.integers(-127, 128, (4, 3, 3, 3), dtype=np.int8)
    bias = RNG.integers(-500, 500, 4).astype(np.int32)
    w_scale, s_out, s_in = F32([0.011, 0.02, 0.005, 0.03]), F32([0.2, 0.07, 0.025, 0.1]), F32([0.05, 0.04, 0.03])
    layer = "QuantizedConvolution c 1 1 x y 1 3 4 3 3 1 1 1 1 1 -1 1 1 2"
    model = quantized_model(tmp_path, [layer], [("Convolution", "c", ["c", 1, w, bias, w_scale])],
                            {"x": s_in, "y": s_out})
    conv = next(n for n in model.graph.nodes if n.op_type == "TnnQConv")
    assert "scale" not in conv.attrs and "relu6_max" not in conv.attrs  # not stored beside the file's scales
    x = RNG.standard_normal((1, 3, 5, 5)).astype(F32) * 3
    q = round_away(x / s_in.reshape(1, 3, 1, 1))
    val = _conv_reference(q, w, bias, 1).astype(F32) * (w_scale / s_out).reshape(1, 4, 1, 1)
    top = round_away(F32(6) / s_out).reshape(1, 4, 1, 1)  # 30, 86, 127 (saturated), 60
    expected = np.clip(round_away(val), 0, top).astype(F32) * s_out.reshape(1, 4, 1, 1)
    np.testing.assert_array_equal(model.instance().run({"x": x})["y"], expected)


def test_dequantize_read_by_a_permute_to_channels_last_writes_channels_last(tmp_path):
    """A detection head's int8 conv -> dequantize -> Permute (0, 2, 3, 1): on the CPU the dequantize writes the
    NHWC float value itself (no transpose runs), with the same values."""
    w = RNG.integers(-127, 128, (4, 3, 3, 3), dtype=np.int8)
    bias = RNG.integers(-500, 500, 4).astype(np.int32)
    w_scale, s_out, s_in = F32([0.011, 0.02, 0.005, 0.03]), F32([0.2, 0.3, 0.25, 0.1]), F32([0.05, 0.04, 0.03])
    layers = ["QuantizedConvolution c 1 1 x t 1 3 4 3 3 1 1 1 1 1 -1 1 1 1", "Permute p 1 1 t y 4 0 2 3 1"]
    model = quantized_model(tmp_path, layers, [("Convolution", "c", ["c", 1, w, bias, w_scale])],
                            {"x": s_in, "t": s_out})
    inst = model.instance()
    # quantize, conv, and the dequantize writing channels-last: nothing else runs (no transpose)
    assert [n.op_type for n in inst.graph.nodes] == ["Int8QuantizeNhwc", "Int8ConvNhwc", "Int8DequantizeToNhwc"]
    x = RNG.standard_normal((1, 3, 5, 5)).astype(F32) * 3
    q = round_away(x / s_in.reshape(1, 3, 1, 1))
    val = np.maximum(_conv_reference(q, w, bias, 1).astype(F32) * (w_scale / s_out).reshape(1, 4, 1, 1), 0)
    expected = (round_away(val).astype(F32) * s_out.reshape(1, 4, 1, 1)).transpose(0, 2, 3, 1)
    got = inst.run({"x": x})["y"]
    assert got.shape == (1, 5, 5, 4)
    np.testing.assert_array_equal(got, expected)



@pytest.mark.parametrize("also_read", [False, True])
def test_dequantize_read_by_a_global_average_pool_pools_the_int8_pixels(tmp_path, also_read):
    """A classifier's head, int8 conv -> dequantize -> global average Pooling: on the CPU the two float ops are one
    Int8DequantizeMeanNhwc (no float map made) giving the float64 mean of the dequantized values bit for bit; where
    the dequantized map has another reader (here a graph output) both stay."""
    w = RNG.integers(-127, 128, (4, 3, 3, 3), dtype=np.int8)
    bias = RNG.integers(-500, 500, 4).astype(np.int32)
    w_scale, s_out, s_in = F32([0.011, 0.02, 0.005, 0.03]), F32([0.2, 0.3, 0.25, 0.1]), F32([0.05, 0.04, 0.03])
    layers = ["QuantizedConvolution c 1 1 x t 1 3 4 3 3 1 1 1 1 1 -1 1 1 1", "Pooling p 1 1 t y 1 0 0 1 1 0 0"]
    model = quantized_model(tmp_path, layers, [("Convolution", "c", ["c", 1, w, bias, w_scale])],
                            {"x": s_in, "t": s_out}, outputs="y t" if also_read else "y")
    inst = model.instance()
    ops = [n.op_type for n in inst.graph.nodes]
    if also_read:
        assert "Int8DequantizeMeanNhwc" not in ops and "GlobalAvgPool" in ops
    else:
        assert ops == ["Int8QuantizeNhwc", "Int8ConvNhwc", "Int8DequantizeMeanNhwc"]
    x = RNG.standard_normal((1, 3, 5, 5)).astype(F32) * 3
    q = round_away(x / s_in.reshape(1, 3, 1, 1))
    val = np.maximum(_conv_reference(q, w, bias, 1).astype(F32) * (w_scale / s_out).reshape(1, 4, 1, 1), 0)
    t = round_away(val).astype(F32) * s_out.reshape(1, 4, 1, 1)
    expected = t.astype(np.float64).mean(axis=(2, 3), keepdims=True).astype(F32)
    got = inst.run({"x": x})["y"]
    if also_read:  # the pool's float32 sums: within float32 rounding of the mean
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    else:
        np.testing.assert_array_equal(got, expected)


def _heads(tmp_path: Path, after: list[str]) -> tuple[engine.Model, np.ndarray, np.ndarray]:
    """A detector's heads: int8 convs -> dequantize -> Permute (0, 2, 3, 1) -> Reshape (0, -1, 2) -> one Concat on
    axis 1 (into `y`), then the layers `after` (output `z` if any): the model, an input and the joined value."""
    w = RNG.integers(-127, 128, (4, 3, 3, 3), dtype=np.int8)
    w2 = RNG.integers(-127, 128, (6, 3, 3, 3), dtype=np.int8)
    bias, bias2 = (RNG.integers(-500, 500, k).astype(np.int32) for k in (4, 6))
    w_scale, w_scale2 = F32([0.011, 0.02, 0.005, 0.03]), RNG.uniform(0.005, 0.03, 6).astype(F32)
    s_in, s_t, s_u = F32([0.05, 0.04, 0.03]), F32([0.2, 0.3, 0.25, 0.1]), F32([0.15])
    layers = ["QuantizedConvolution c 1 1 x t 1 3 4 3 3 1 1 1 1 1 -1 1 1 1",
              "QuantizedConvolution d 1 1 x u 1 3 6 3 3 2 2 1 1 1 -1 1 1 0",
              "Permute p 1 1 t tp 4 0 2 3 1", "Permute q 1 1 u up 4 0 2 3 1",
              "Reshape r 1 1 tp tr 0 3 3 0 -1 2 0", "Reshape s 1 1 up ur 0 3 3 0 -1 2 0",
              "Concat j 2 1 tr ur y 1", *after]
    model = quantized_model(tmp_path, layers, [("Convolution", "c", ["c", 1, w, bias, w_scale]),
                                               ("Convolution", "d", ["d", 1, w2, bias2, w_scale2])],
                            {"x": s_in, "t": s_t, "u": s_u}, outputs="z" if after else "y")
    x = RNG.standard_normal((1, 3, 5, 5)).astype(F32) * 3
    q = round_away(x / s_in.reshape(1, 3, 1, 1))
    t = np.maximum(_conv_reference(q, w, bias, 1).astype(F32) * (w_scale / s_t).reshape(1, 4, 1, 1), 0)
    u = _conv_reference(q, w2, bias2, 1)[:, :, ::2, ::2].astype(F32) * (w_scale2 / s_u).reshape(1, 6, 1, 1)
    heads = [(round_away(v).astype(F32) * s.reshape(1, -1, 1, 1)).transpose(0, 2, 3, 1).reshape(1, -1, 2)
             for v, s in ((t, s_t), (u, s_u))]
    return model, x, np.concatenate(heads, axis=1)


def test_heads_dequantized_reshaped_and_joined_write_the_join(tmp_path):
    """On the CPU each head is dequantized straight into the joined value (no transpose, reshape or concat
    runs), with the same values."""
    model, x, joined = _heads(tmp_path, [])
    inst = model.instance()
    assert [n.op_type for n in inst.graph.nodes] == ["Int8QuantizeNhwc", "Int8ConvNhwc", "Int8ConvNhwc",
                                                     "Int8DequantizeConcatNhwc"]
    got = inst.run({"x": x})["y"]
    assert got.shape == (1, 50 + 27, 2)
    np.testing.assert_array_equal(got, joined)


@pytest.mark.parametrize("axis", [2, -1])
def test_a_softmax_over_the_joined_heads_last_axis_is_done_by_the_join(tmp_path, axis):
    """A detector's class scores: the Softmax over the last axis that alone reads the joined heads runs inside
    the join, on the values while they are in cache; float32 results within a few ulps of the float64
    reference's (one exp per pair, the difference of the two rounded once)."""
    model, x, joined = _heads(tmp_path, [f"Softmax m 1 1 y z {axis}"])
    inst = model.instance()
    assert [n.op_type for n in inst.graph.nodes][-1] == "Int8DequantizeConcatNhwc"
    got = inst.run({"x": x})["z"]
    e = np.exp(joined.astype(np.float64) - joined.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=-1, keepdims=True), rtol=2e-6, atol=0)


def test_a_softmax_over_another_axis_stays_a_softmax(tmp_path):
    model, x, joined = _heads(tmp_path, ["Softmax m 1 1 y z 1"])
    inst = model.instance()
    assert [n.op_type for n in inst.graph.nodes][-2:] == ["Int8DequantizeConcatNhwc", "Softmax"]
    e = np.exp(joined.astype(np.float64) - joined.max(axis=1, keepdims=True))
    np.testing.assert_allclose(inst.run({"x": x})["z"], e / e.sum(axis=1, keepdims=True), rtol=1e-5)


def test_image_quantized_for_convs_only_is_read_as_u8_with_a_zero_point(tmp_path):
    """The float input's quantize, read by convs only, writes q + 128 as uint8 and its convs take the 128 off:
    the same values, -128 and 127 among the inputs. A quantize that anything else reads stays int8."""
    w = RNG.integers(-127, 128, (16, 3, 3, 3), dtype=np.int8)
    w2 = RNG.integers(-127, 128, (4, 3, 1, 1), dtype=np.int8)
    bias, bias2 = RNG.integers(-500, 500, 16).astype(np.int32), RNG.integers(-500, 500, 4).astype(np.int32)
    w_scale, w_scale2 = RNG.uniform(0.005, 0.03, 16).astype(F32), RNG.uniform(0.005, 0.03, 4).astype(F32)
    s_in, s_t, s_u = F32([0.05, 0.04, 0.03]), RNG.uniform(0.1, 0.3, 16).astype(F32), F32([0.2])
    layers = ["QuantizedConvolution c 1 1 x t 1 3 16 3 3 2 2 1 1 1 -1 1 1 1",
              "QuantizedConvolution d 1 1 x u 1 3 4 1 1 1 1 0 0 1 -1 1 1 0"]
    model = quantized_model(tmp_path, layers, [("Convolution", "c", ["c", 1, w, bias, w_scale]),
                                               ("Convolution", "d", ["d", 1, w2, bias2, w_scale2])],
                            {"x": s_in, "t": s_t, "u": s_u}, inputs="x 4 1 3 9 9", outputs="t u")
    inst = model.instance()
    quantize = inst.graph.nodes[0]
    convs = [n for n in inst.graph.nodes if n.op_type == "Int8ConvNhwc"]
    assert quantize.params["zero_point"] == 128 and quantize.outputs[0].dtype == np.uint8
    assert [c.params["src_zero_point"] for c in convs] == [128, 128]
    x = RNG.standard_normal((1, 3, 9, 9)).astype(F32) * 4
    x[0, :, 0, 0], x[0, :, 0, 1] = -100, 100  # beyond the int8 range both ways
    q = round_away(x / s_in.reshape(1, 3, 1, 1))
    assert q.min() == -128 and q.max() == 127
    t = _conv_reference(q, w, bias, 1)[:, :, ::2, ::2].astype(F32) * (w_scale / s_t).reshape(1, 16, 1, 1)
    u = _conv_reference(q, w2, bias2, 0).astype(F32) * (w_scale2 / s_u).reshape(1, 4, 1, 1)
    got = inst.run({"x": x})
    np.testing.assert_array_equal(got["t"], round_away(np.maximum(t, 0)).astype(F32) * s_t.reshape(1, 16, 1, 1))
    np.testing.assert_array_equal(got["u"], round_away(u).astype(F32) * s_u)

    layers = ["QuantizedConvolution c 1 1 x t 1 3 3 1 1 1 1 0 0 1 -1 1 1 1", "QuantizedAdd a 2 1 x t y 1"]
    model = quantized_model(tmp_path, layers, [("Convolution", "c", ["c", 1, w2[:3], bias2[:3], w_scale2[:3]])],
                            {"x": s_in, "t": F32([0.07, 0.06, 0.05]), "y": F32([0.09])})
    inst = model.instance()
    assert "zero_point" not in inst.graph.nodes[0].params and inst.graph.nodes[0].outputs[0].dtype == np.int8

def test_one_by_one_conv_fused_into_the_add_rounds_once(tmp_path):
    w = RNG.integers(-127, 128, (3, 3, 1, 1), dtype=np.int8)
    bias = RNG.integers(-50, 50, 3).astype(np.int32)
    w_scale, s_x, s_c, s_y = F32([0.02, 0.03, 0.01]), F32([0.05]), F32([0.07]), F32([0.09])
    layers = ["QuantizedConvolution c 1 1 x t 1 3 3 1 1 1 1 0 0 1 -1 1 1 0", "QuantizedAdd a 2 1 x t y 1"]
    model = quantized_model(tmp_path, layers, [("Convolution", "c", ["c", 1, w, bias, w_scale])],
                            {"x": s_x, "t": s_c, "y": s_y})
    assert "TnnQAdd" not in model.op_counts()  # TNN folds the add into the 1x1 conv
    x = RNG.standard_normal((1, 3, 5, 5)).astype(F32)
    q = round_away(x / s_x)
    acc = _conv_reference(q, w, bias, 0)
    val = acc.astype(F32) * (w_scale / s_y).reshape(1, 3, 1, 1) + q.astype(F32) * (s_x / s_y)
    expected = round_away(val).astype(F32) * s_y
    np.testing.assert_array_equal(model.instance().run({"x": x})["y"], expected)


def test_int8_model_written_back_computes_the_same(tmp_path):
    from engine.formats.tnn.writer.write import write_tnn

    w = RNG.integers(-127, 128, (3, 3, 1, 1), dtype=np.int8)
    layers = ["QuantizedConvolution c 1 1 x t 1 3 3 1 1 1 1 0 0 1 -1 1 1 1", "QuantizedAdd a 2 1 x t s 1",
              "QuantizedPooling p 1 1 s y 0 2 2 2 2 0 0 -1 -1 -1 1"]
    scales = {"x": F32([0.05]), "t": F32([0.07, 0.06, 0.05]), "s": F32([0.09]), "y": F32([0.09])}
    model = quantized_model(tmp_path, layers, [("Convolution", "c", ["c", 1, w, np.arange(3, dtype=np.int32),
                                                                    F32([0.02, 0.03, 0.01])])], scales)
    x = RNG.standard_normal((1, 3, 5, 5)).astype(F32)
    for version in (1, 2):
        proto, _ = write_tnn(model.graph, tmp_path / f"again{version}", version=version)
        again = engine.load(proto)
        assert again.op_counts() == model.op_counts()
        np.testing.assert_array_equal(again.instance().run({"x": x})["y"], model.instance().run({"x": x})["y"])


def test_unfused_add_rescales_both_inputs(tmp_path):
    layers = ["QuantizedReLU r 1 1 x t", "QuantizedAdd a 2 1 x t y 1"]
    s_x, s_t, s_y = F32([0.05, 0.04, 0.03]), F32([0.05, 0.04, 0.03]), F32([0.06, 0.05, 0.02])
    model = quantized_model(tmp_path, layers, [], {"x": s_x, "t": s_t, "y": s_y})
    x = RNG.standard_normal((1, 3, 5, 5)).astype(F32)
    q = round_away(x / s_x.reshape(1, 3, 1, 1))
    t = np.maximum(q, 0)
    acc = (s_x.reshape(1, 3, 1, 1) * q.astype(F32) + s_t.reshape(1, 3, 1, 1) * t.astype(F32)).astype(F32)
    expected = round_away(acc / s_y.reshape(1, 3, 1, 1)).astype(F32) * s_y.reshape(1, 3, 1, 1)
    np.testing.assert_array_equal(model.instance().run({"x": x})["y"], expected)


@pytest.mark.parametrize("relu_alone", [True, False])
def test_a_relu_that_alone_reads_an_add_is_done_by_the_add(tmp_path, relu_alone):
    """ResNet's residual: Add then ReLU. On the CPU the add's twin applies max(q, 0) to its rounded output (no
    ReLU pass), the same values as the two ops; a ReLU whose add has another reader (a graph output) stays."""
    layers = ["QuantizedReLU r 1 1 x t", "QuantizedAdd a 2 1 x t s 1", "QuantizedReLU b 1 1 s y"]
    s_x, s_y = F32([0.05, 0.04, 0.03]), F32([0.06, 0.05, 0.02])
    model = quantized_model(tmp_path, layers, [], {"x": s_x, "t": s_x, "s": s_y, "y": s_y},
                            outputs="y" if relu_alone else "y s")
    inst = model.instance()
    ops = [n.op_type for n in inst.graph.nodes]
    assert ("TnnQRelu" in ops[ops.index("Int8AddNhwc"):]) != relu_alone
    x = RNG.standard_normal((1, 3, 5, 5)).astype(F32) * 4
    q = round_away(x / s_x.reshape(1, 3, 1, 1))
    acc = (s_x.reshape(1, 3, 1, 1) * q.astype(F32) + s_x.reshape(1, 3, 1, 1) * np.maximum(q, 0).astype(F32))
    s = round_away(acc.astype(F32) / s_y.reshape(1, 3, 1, 1))
    assert s.min() < 0 and s.max() == 127
    got = inst.run({"x": x})
    np.testing.assert_array_equal(got["y"], np.maximum(s, 0).astype(F32) * s_y.reshape(1, 3, 1, 1))
    if not relu_alone:
        np.testing.assert_array_equal(got["s"], s.astype(F32) * s_y.reshape(1, 3, 1, 1))


def test_int8_pooling_truncates_averages_and_floors_max_at_minus_127(tmp_path):
    layers = ["QuantizedPooling p 1 1 x a 1 2 2 2 2 0 0 -1 -1 -1 0", "QuantizedPooling m 1 1 x b 0 2 2 2 2 0 0",
              "QuantizedConcat c 2 1 a b y 2"]
    scale = F32([1.0])
    model = quantized_model(tmp_path, layers, [], {"x": scale, "a": scale, "b": scale, "y": scale},
                            inputs="x 4 1 1 5 5")
    x = np.full((1, 1, 5, 5), -200.0, F32)  # saturates to -128
    x[0, 0, 0, :2] = [-3, 0]
    got = model.instance().run({"x": x})["y"]
    # avg of (-3, 0, -128, -128) = -259 / 4 -> -64 (C++ truncates toward zero); max pools start at -127
    assert got.shape == (1, 1, 4, 2)
    np.testing.assert_array_equal(got[0, 0], [[-64, -128], [-128, -128], [0, -127], [-127, -127]])


def test_missing_blob_scale_is_a_format_error(tmp_path):
    with pytest.raises(ModelFormatError, match="y_scale_data_"):
        quantized_model(tmp_path, ["QuantizedReLU r 1 1 x y"], [], {"x": F32([0.1])})


def test_concat_requantizes_per_tensor_inputs(tmp_path):
    layers = ["QuantizedReLU r 1 1 x a", "QuantizedConcat c 2 1 x a y 1"]
    s_x, s_a, s_y = F32([0.05]), F32([0.05]), F32([0.07])
    model = quantized_model(tmp_path, layers, [], {"x": s_x, "a": s_a, "y": s_y})
    x = RNG.standard_normal((1, 3, 5, 5)).astype(F32)
    q = round_away(x / s_x)
    parts = [round_away(q.astype(F32) * s_x / s_y), round_away(np.maximum(q, 0).astype(F32) * s_a / s_y)]
    expected = np.concatenate(parts, axis=1).astype(F32) * s_y
    np.testing.assert_array_equal(model.instance().run({"x": x})["y"], expected)


def test_quantized_convolution_nhwc_is_tnns_other_spelling_of_quantized_convolution(tmp_path):
    """layer_type.cc maps both strings to LAYER_CONVOLUTION, the `Quantized` prefix marking it int8 in both."""
    w = RNG.integers(-127, 128, (4, 3, 3, 3), dtype=np.int8)
    bias = RNG.integers(-500, 500, 4).astype(np.int32)
    w_scale, s_out, s_in = F32([0.011, 0.02, 0.005, 0.03]), F32([0.2, 0.3, 0.25, 0.1]), F32([0.05, 0.04, 0.03])
    x = RNG.standard_normal((1, 3, 5, 5)).astype(F32) * 3
    outs = []
    for ltype in ("QuantizedConvolution", "QuantizedConvolution_nhwc"):
        (tmp_path / ltype).mkdir()
        layer = f"{ltype} c 1 1 x y 1 3 4 3 3 1 1 1 1 1 -1 1 1 1"
        model = quantized_model(tmp_path / ltype, [layer], [("Convolution", "c", ["c", 1, w, bias, w_scale])],
                                {"x": s_in, "y": s_out})
        outs.append(model.instance().run({"x": x})["y"])
    np.testing.assert_array_equal(outs[1], outs[0])
