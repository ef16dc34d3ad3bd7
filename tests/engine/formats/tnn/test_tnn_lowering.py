"""TNN layer semantics after lowering, on small hand-written TNN files against plain numpy references."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import engine
from engine.errors import ModelFormatError, UnsupportedOpError
from engine.formats.tnn.lowering.lower import HANDLED_TYPES
from engine.formats.tnn.serializer import Serializer

RNG = np.random.default_rng(3)


def tnn_model(tmp_path: Path, inputs: str, layers: list[str], outputs: str, resources=(), consts=(),
              version: int = 2) -> engine.Model:
    """Writes a .tnnproto/.tnnmodel pair. resources: (type, name, [items]); items are arrays, ints, strs or bools
    (one-byte flags)."""
    magic = 4206624772 if version == 2 else 4206624770
    records = [f"1 0 1 {magic}", inputs, " ", outputs, f" {len(layers)}", *layers]
    (tmp_path / "m.tnnproto").write_text("".join(f'"{r} ,"\n' for r in records))
    s = Serializer(version)
    s.u32(s.magic)
    s.i32(len(resources))
    for ltype, name, items in resources:
        s.i32(0), s.string(ltype), s.string(name)
        for item in items:
            if isinstance(item, bool):  # a one-byte flag (Deserializer::GetBool)
                s.parts.append(bytes([item]))
            else:
                s.string(item) if isinstance(item, str) else s.i32(item) if isinstance(item, int) else s.raw(item)
    if consts:
        s.u32(s.magic), s.i32(len(consts))
        for name, data in consts:
            s.string(name), s.raw(data)
    (tmp_path / "m.tnnmodel").write_bytes(s.getvalue())
    return engine.load(tmp_path / "m.tnnproto")


def run1(model: engine.Model, *xs: np.ndarray) -> np.ndarray:
    out = model.instance().run({spec.name: x for spec, x in zip(model.inputs, xs, strict=True)})
    return out[model.outputs[0].name]


X4 = RNG.standard_normal((1, 4, 6, 8)).astype(np.float32)
IN4 = "x 4 1 4 6 8 0"


@pytest.mark.parametrize("layer, expect", [
    # old StridedSlice: NCHW lists, an end of 0 means "to the end"
    ("StridedSlice s 1 1 x y 4 0 1 0 0 4 0 3 0 -1 4 1 1 1 2", lambda x: x[:, 1:3, :, 0:-1:2]),
    ("StridedSliceV2 s 1 1 x y 2 2 3 2 2147483647 7 2 2 3 2 2 1", lambda x: x[:, :, 2::2, 3:7]),
    ("Permute p 1 1 x y 3 0 2 1", lambda x: x.transpose(0, 2, 1, 3)),
    # the axes the orders leave out follow in ascending order (PermuteLayer::InferOutputShape)
    ("Permute p 1 1 x y 2 2 0", lambda x: x.transpose(2, 0, 1, 3)),
    ("Pad p 1 1 x y 0 0 1 2 3 0 0 1 0 0.5", lambda x: np.pad(x, ((0, 0), (0, 1), (1, 2), (3, 0)), constant_values=0.5)),
    ("Pad p 1 1 x y 0 0 1 1 2 2 0 0 1 0", lambda x: np.pad(x, ((0, 0), (0, 0), (1, 1), (2, 2)), mode="reflect")),
    ("PadV2 p 1 1 x y 4 0 0 1 0 0 0 2 1 2 0", lambda x: np.pad(x, ((0, 0), (0, 0), (1, 2), (0, 1)), mode="edge")),
    ("Clip c 1 1 x y -1.79769e+308 0.25", lambda x: np.minimum(x, 0.25)),
    ("Reshape r 1 1 x y 0 3 3 0 -1 4 0", lambda x: x.reshape(1, 48, 4)),
    ("Flatten f 1 1 x y 1", lambda x: x.reshape(1, -1)),
    ("Flatten f 1 1 x y 2", lambda x: x.reshape(4, -1)),
    ("Normalize n 1 1 x y 0 1e-12 0 1 2", lambda x: x / np.sqrt((x * x).sum(1, keepdims=True))),
    ("ShuffleChannel s 1 1 x y 2", lambda x: x.reshape(1, 2, 2, 6, 8).transpose(0, 2, 1, 3, 4).reshape(x.shape)),
    ("SoftmaxCaffe s 1 1 x y 1", lambda x: np.exp(x) / np.exp(x).sum(1, keepdims=True)),
    ("ReduceMean r 1 1 x y 0 2 3", lambda x: x.mean((2, 3))),
    ("HardSigmoid h 1 1 x y 0.2 0.5", lambda x: np.clip(0.2 * x + 0.5, 0, 1)),
    ("LeakyRelu l 1 1 x y 0.3", lambda x: np.where(x > 0, x, 0.3 * x)),
    ("LeakyRelu l 1 1 x y", lambda x: np.where(x > 0, x, 0.01 * x)),  # no alpha param: 0.01
    ("Upsample u 1 1 x y 1 2 2 0", lambda x: x.repeat(2, 2).repeat(2, 3)),
])
def test_single_layer_semantics(tmp_path, layer, expect):
    model = tnn_model(tmp_path, IN4, [layer], "y")
    np.testing.assert_allclose(run1(model, X4), expect(X4), rtol=1e-5, atol=1e-6)


def _tnn_bilinear_align(x: np.ndarray, oh: int, ow: int) -> np.ndarray:
    h, w = x.shape[2:]
    ys, xs = np.linspace(0, h - 1, oh), np.linspace(0, w - 1, ow)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    top = x[..., y0, :][..., x0] * (1 - fx) + x[..., y0, :][..., x1] * fx
    bot = x[..., y1, :][..., x0] * (1 - fx) + x[..., y1, :][..., x1] * fx
    return top * (1 - fy) + bot * fy


def test_upsample_to_size_bilinear_align_corners_and_nearest_rounding(tmp_path):
    model = tnn_model(tmp_path, IN4, ["Upsample u 1 1 x y 2 0 0 1 11 13"], "y")
    np.testing.assert_allclose(run1(model, X4), _tnn_bilinear_align(X4, 11, 13), rtol=1e-5, atol=1e-5)
    model = tnn_model(tmp_path, IN4, ["Upsample u 1 1 x y 1 0 0 0 9 10"], "y")
    rows, cols = (np.arange(9) * (6 / 9)).astype(int), (np.arange(10) * (8 / 10)).astype(int)  # floor(dst * in/out)
    np.testing.assert_array_equal(run1(model, X4), X4[:, :, rows][..., cols])


def test_pooling_never_averages_padding(tmp_path):
    model = tnn_model(tmp_path, IN4, ["Pooling p 1 1 x y 1 3 3 2 2 1 1 -1 -1 -1 1 0"], "y")
    got = run1(model, X4)
    padded = np.pad(X4, ((0, 0), (0, 0), (1, 2), (1, 2)), constant_values=np.nan)
    oh, ow = int(np.ceil((6 + 2 - 3) / 2 + 1)), int(np.ceil((8 + 2 - 3) / 2 + 1))
    ref = np.stack([np.stack([np.nanmean(padded[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3], axis=(2, 3))
                              for j in range(ow)], -1) for i in range(oh)], -2)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_stored_constant_operands_v1_per_channel_and_reversed(tmp_path):
    k = np.arange(4, dtype=np.float32)
    layers = ["Sub s 1 1 x t 0", "Mul m 1 1 t y 1"]
    model = tnn_model(tmp_path, "x 1 4 6 8", layers, "y", [("Sub", "s", [k]), ("Mul", "m", [np.float32([3])])],
                      version=1)
    np.testing.assert_allclose(run1(model, X4), (k.reshape(1, 4, 1, 1) - X4) * 3, rtol=1e-6)


def test_hardswish_with_two_inputs_and_splitv(tmp_path):
    layers = ["SplitV s 1 2 x a b 1 0", "HardSwish h 2 1 a b y 0.2 0.5"]
    model = tnn_model(tmp_path, IN4, layers, "y")
    a, b = X4[:, :2], X4[:, 2:]
    np.testing.assert_allclose(run1(model, X4), a * np.clip(0.2 * b + 0.5, 0, 1), rtol=1e-6, atol=1e-7)


def test_reshape_shape_from_constant_map_and_inner_product_keeps_rank(tmp_path):
    w, b = RNG.standard_normal((5, 192)).astype(np.float32), RNG.standard_normal(5).astype(np.float32)
    layers = ["Reshape r 2 1 x shape t 0 0 0 0", "InnerProduct fc 1 1 t y 5 1 0 1"]
    consts = [("shape", np.array([1, 8, 6, 4], np.int32))]
    model = tnn_model(tmp_path, "x 4 1 4 6 8 0", layers, "y", [("InnerProduct", "fc", ["fc", w, b])], consts)
    got = run1(model, X4)
    assert got.shape == (1, 5, 1, 1)  # TNN keeps the rank: dims after the axis become 1
    np.testing.assert_allclose(got.reshape(1, 5), X4.reshape(1, -1) @ w.T + b, rtol=1e-5, atol=1e-5)


def test_layer_without_lowering_names_type_and_line(tmp_path):
    with pytest.raises(UnsupportedOpError) as e:
        tnn_model(tmp_path, IN4, ["ReLU r 1 1 x t", "Deconvolution3D l 1 1 t y"], "y")
    assert "Deconvolution3D" in str(e.value) and "m.tnnproto:7" in str(e.value)


def test_missing_resource_is_a_format_error_with_line(tmp_path):
    with pytest.raises(ModelFormatError, match="filter") as e:
        tnn_model(tmp_path, IN4, ["Convolution c 1 1 x y 1 4 4 3 3 1 1 1 1 0 -1 1 1"], "y")
    assert e.value.line == 6


def test_reshape_in_tensorflow_order(tmp_path):
    # reshape_type 1: the target (1, 2, 12, 8) is taken in NHWC order between NCHW<->NHWC permutes
    model = tnn_model(tmp_path, IN4, ["Reshape r 1 1 x y 0 4 4 0 2 12 -1 1"], "y")
    ref = X4.transpose(0, 2, 3, 1).reshape(1, 12, 8, 2).transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(run1(model, X4), ref)


def test_constant_of_shape(tmp_path):
    layers = ["Shape s 1 1 x shp", "ConstantOfShape c 1 1 shp y"]
    model = tnn_model(tmp_path, IN4, layers, "y", [("ConstantOfShape", "c", [np.float32([2.5])])])
    np.testing.assert_array_equal(run1(model, X4), np.full(X4.shape, 2.5, np.float32))


@pytest.mark.parametrize("case, direction", [("fwd", 0), ("bi", 2)])
def test_lstm_matches_torch(tmp_path, case, direction):
    g = np.load(Path(__file__).resolve().parents[3] / "fixtures" / "tnn" / "lstm_golden.npz")
    consts = [(k, g[f"{case}/{k}"]) for k in ("w", "r", "b", "h0", "c0")]
    layer = f"LSTMONNX l 6 3 x w r b h0 c0 y yh yc 0 5 {direction}"
    model = tnn_model(tmp_path, "x 3 7 2 6 0", [layer], "y yh yc", consts=consts)
    out = model.instance().run({"x": g[f"{case}/x"]})
    for mine, torch_name in (("y", "y"), ("yh", "hn"), ("yc", "cn")):
        np.testing.assert_allclose(out[mine], g[f"{case}/{torch_name}"], rtol=1e-5, atol=1e-6)


SELU_ALPHA, SELU_GAMMA = 1.6732632, 1.0507009


@pytest.mark.parametrize("layer, expect", [
    (f"Selu s 1 1 x y {SELU_ALPHA} {SELU_GAMMA}",
     lambda x: SELU_GAMMA * np.where(x > 0, x, SELU_ALPHA * (np.exp(x) - 1))),
    ("Softsign s 1 1 x y", lambda x: x / (1 + np.abs(x))),
    ("LogSigmoid s 1 1 x y", lambda x: -np.log1p(np.exp(-x))),
])
def test_onnx2tnn_activations(tmp_path, layer, expect):
    x = (X4 * 8).astype(np.float32)  # reaches softplus's threshold both ways
    np.testing.assert_allclose(run1(tnn_model(tmp_path, IN4, [layer], "y"), x), expect(x.astype(np.float64)),
                               rtol=1e-5, atol=1e-6)


def test_selu_without_its_params_is_a_format_error_with_line(tmp_path):
    with pytest.raises(ModelFormatError, match="parameter 1") as e:
        tnn_model(tmp_path, IN4, ["Selu s 1 1 x y 1.67"], "y")
    assert e.value.line == 6


def test_where_takes_x_y_condition_in_tnns_order(tmp_path):
    a, b = X4, RNG.standard_normal((1, 4, 6, 8)).astype(np.float32)
    layers = ["Greater g 2 1 a b c", "Where w 3 1 a b c y"]
    model = tnn_model(tmp_path, "a 4 1 4 6 8 0 : b 4 1 4 6 8 0", layers, "y")
    np.testing.assert_array_equal(run1(model, a, b), np.maximum(a, b))


def test_where_refuses_a_float_condition(tmp_path):
    with pytest.raises(ModelFormatError, match="condition") as e:
        tnn_model(tmp_path, "a 4 1 4 6 8 0 : b 4 1 4 6 8 0", ["Where w 3 1 a b b y"], "y")
    assert e.value.line == 6


VOCABULARY = Path(__file__).resolve().parents[4] / "docs" / "vocabulary" / "tnn_layers.txt"
ONNX2TNN = sorted(line.split()[0] for line in VOCABULARY.read_text().splitlines()
                  if not line.startswith("#") and line.split()[-1:] == ["onnx2tnn"])
ONNX2TNN_REFUSED = [t for t in ONNX2TNN if t not in HANDLED_TYPES]


def test_the_onnx2tnn_vocabulary_is_read():
    assert len(ONNX2TNN) > 100 and {"Convolution", "Selu", "Where", "LRN"} <= set(ONNX2TNN)


@pytest.mark.parametrize("ltype", ONNX2TNN_REFUSED)
def test_every_onnx2tnn_layer_without_lowering_is_refused_with_type_and_line(tmp_path, ltype):
    """A layer type TNN's ONNX converter writes that the engine does not lower is refused at load, naming the
    layer type, the layer and the file:line; never a silent result."""
    with pytest.raises((UnsupportedOpError, ModelFormatError)) as e:
        tnn_model(tmp_path, IN4, ["ReLU r 1 1 x t", f"{ltype} odd 1 1 t y"], "y")
    assert ltype in str(e.value) and "m.tnnproto:7" in str(e.value) and "odd" in str(e.value)


@pytest.mark.parametrize("params, k, largest", [("1 1 1 2", 2, True), ("-1 0 1 3", 3, False), ("3 1 1 50", 8, True)])
def test_topk_gives_values_and_int32_indices_with_k_capped_at_the_dim(tmp_path, params, k, largest):
    axis = int(params.split()[0])
    x = np.random.default_rng(5).permutation(X4.size).reshape(X4.shape).astype(np.float32)  # no ties
    model = tnn_model(tmp_path, IN4, [f"TopK t 1 2 x v i {params}"], "v i")
    out = model.instance().run({"x": x})
    order = np.argsort(-x if largest else x, axis=axis, kind="stable")
    want = np.take(order, range(k), axis=axis)
    assert out["i"].dtype == np.int32
    np.testing.assert_array_equal(out["i"], want)
    np.testing.assert_array_equal(out["v"], np.take_along_axis(x, want, axis=axis))


def test_topk_with_k_0_is_a_format_error_with_line(tmp_path):
    with pytest.raises(ModelFormatError, match="k=0") as e:
        tnn_model(tmp_path, IN4, ["TopK t 1 2 x v i 1 1 1 0"], "v i")
    assert e.value.line == 6


def naive_reorg(x: np.ndarray, stride: int, forward: int, mode: int) -> np.ndarray:
    """TNN's NaiveReorg (utils/naive_compute.cc), loop for loop: (width, height, channel) are the input's dims when
    forward, the output's otherwise."""
    n, c, h, w = x.shape
    if forward:
        out = np.zeros((n, c // stride**2, h * stride, w * stride), x.dtype)
        dims = (c, h, w)
    else:
        out = np.zeros((n, c * stride**2, h // stride, w // stride), x.dtype)
        dims = out.shape[1:]
    channel, height, width = dims
    out_c = channel // (stride * stride)
    big, small = (out, x) if forward else (x, out)
    for b, ch, hh, ww in np.ndindex(n, channel, height, width):
        c2, offset = (ch % out_c, ch // out_c) if mode == 0 else (ch // (stride * stride), ch % (stride * stride))
        h2, w2 = hh * stride + offset // stride, ww * stride + offset % stride
        if forward:
            big[b, c2, h2, w2] = small[b, ch, hh, ww]
        else:
            small[b, ch, hh, ww] = big[b, c2, h2, w2]
    return out


@pytest.mark.parametrize("forward", [1, 0])
@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("stride", [2, 3])
def test_reorg_matches_tnns_naive_loops(tmp_path, forward, mode, stride):
    shape = (2, 2 * stride * stride, 2, 3) if forward else (2, 2, 2 * stride, 3 * stride)
    x = RNG.standard_normal(shape).astype(np.float32)
    model = tnn_model(tmp_path, "x 4 " + " ".join(map(str, shape)) + " 0", [f"Reorg r 1 1 x y {stride} {forward} 0 "
                                                                          f"{mode}"], "y")
    np.testing.assert_array_equal(run1(model, x), naive_reorg(x, stride, forward, mode))


def test_reorg_with_an_unknown_mode_is_a_format_error_with_line(tmp_path):
    with pytest.raises(ModelFormatError, match="mode=2") as e:
        tnn_model(tmp_path, IN4, ["Reorg r 1 1 x y 2 1 0 2"], "y")
    assert e.value.line == 6


def naive_lrn(x: np.ndarray, alpha: float, beta: float, bias: float, size: int) -> np.ndarray:
    """TNN's CpuLRNLayerAcc, loop for loop (its integer (size - 1) / 2 included)."""
    x = x.astype(np.float64)
    square = np.zeros_like(x)
    n, channel = x.shape[:2]
    for b, ch in np.ndindex(n, channel):
        for i in range(max(0, ch - (size - 1) // 2), min(channel, ch + (size - 1) // 2 + 1)):
            square[b, ch] += x[b, i] ** 2
    return x / (bias + (alpha / size) * square) ** beta


@pytest.mark.parametrize("alpha, beta, bias, size", [(1e-4, 0.75, 1.0, 5), (0.5, 0.5, 2.0, 3), (2.0, 1.0, 1.0, 1)])
def test_lrn_matches_tnns_loops(tmp_path, alpha, beta, bias, size):
    x = X4 * 3
    model = tnn_model(tmp_path, IN4, [f"LRN l 1 1 x y {alpha} {beta} {bias} {size}"], "y")
    np.testing.assert_allclose(run1(model, x), naive_lrn(x, alpha, beta, bias, size), rtol=1e-5, atol=1e-6)


def test_lrn_of_an_even_size_is_refused_with_line(tmp_path):
    with pytest.raises(ModelFormatError, match="even size") as e:
        tnn_model(tmp_path, IN4, ["LRN l 1 1 x y 0.0001 0.75 1 4"], "y")
    assert e.value.line == 6


def test_size_is_the_element_count_as_one_int32(tmp_path):
    layers = ["Size s 1 1 x n", "Cast c 1 1 n f 0", "Add a 2 1 x f y"]  # the count, as a float, added to x
    got = run1(tnn_model(tmp_path, IN4, layers, "y"), X4)
    np.testing.assert_allclose(got, X4 + X4.size, rtol=1e-6)
    model = tnn_model(tmp_path, IN4, ["Size s 1 1 x y"], "y")
    out = run1(model, X4)
    assert out.dtype == np.int32 and out.tolist() == [X4.size]


IN3 = "x 3 2 4 11 0"
X3 = RNG.standard_normal((2, 4, 11)).astype(np.float32)


def naive_conv1d(x, w, bias, stride, pad, group, dilation, out_len):
    """TNN's NaiveConv1D, loop for loop (w: out * in/group * kernel, flat)."""
    n, ic, length = x.shape
    oc, k = bias.size, w.size // (bias.size * (ic // group))
    icg, ocg = ic // group, oc // group
    w = w.reshape(oc, icg, k)
    y = np.zeros((n, oc, out_len))
    for b, o, h in np.ndindex(n, oc, out_len):
        g = o // ocg
        for kh in range(k):
            ih = h * stride - pad + kh * dilation
            if 0 <= ih < length:
                for i in range(g * icg, g * icg + icg):
                    y[b, o, h] += float(x[b, i, ih]) * float(w[o, i - g * icg, kh])
        y[b, o, h] += bias[o]
    return y


@pytest.mark.parametrize("group, k, stride, right, left, pad_type, dil, act", [
    (1, 3, 1, 1, 1, -1, 1, 0), (2, 3, 2, 2, 0, -1, 2, 1), (4, 1, 3, 0, 0, -1, 1, 0), (1, 4, 2, 0, 0, 0, 1, 0),
    (2, 3, 2, 0, 0, 1, 1, 0)])
def test_convolution1d_matches_tnns_loops(tmp_path, group, k, stride, right, left, pad_type, dil, act):
    oc = 8
    w = RNG.standard_normal(oc * (4 // group) * k).astype(np.float32)
    bias = RNG.standard_normal(oc).astype(np.float32)
    layer = f"Convolution1D c 1 1 x y {group} 4 {oc} {k} {stride} {right} {left} 1 {pad_type} {dil} {act}"
    model = tnn_model(tmp_path, IN3, [layer], "y", resources=[("Convolution1D", "c", ["c", 1, w, bias])])
    if pad_type == 0:  # TNN's SAME: out = ceil(L / stride), pad_top = pad_along / 2
        out_len = -(-11 // stride)
        left = max((out_len - 1) * stride + k - 11, 0) // 2
    elif pad_type == 1:
        out_len = -(-(11 - k + 1) // stride)
    else:
        out_len = (11 + left + right - dil * (k - 1) - 1) // stride + 1
    want = naive_conv1d(X3, w, bias, stride, left, group, dil, out_len)
    want = np.maximum(want, 0) if act == 1 else want
    np.testing.assert_allclose(run1(model, X3), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer", ["Convolution1D c 1 1 x y 1 4 6 3 2 0 0 1 0 2 0",
                                   "Convolution1D c 1 1 x y 1 4 6 3 3 0 0 1 1 1 0",
                                   "Convolution1D c 1 1 x y 1 4 6 3 1 0 0 1 -1 1 3"])
def test_convolution1d_variants_tnn_computes_otherwise_are_refused(tmp_path, layer):
    w, bias = np.zeros(72, np.float32), np.zeros(6, np.float32)
    with pytest.raises(UnsupportedOpError, match="Convolution1D") as e:
        tnn_model(tmp_path, IN3, [layer], "y", resources=[("Convolution1D", "c", ["c", 1, w, bias])])
    assert "m.tnnproto:6" in str(e.value)


def test_convolution1d_with_a_wrong_filter_size_is_a_format_error_with_line(tmp_path):
    w, bias = np.zeros(70, np.float32), np.zeros(6, np.float32)
    with pytest.raises(ModelFormatError, match="filter") as e:
        tnn_model(tmp_path, IN3, ["Convolution1D c 1 1 x y 1 4 6 3 1 0 0 1 -1 1 0"], "y",
                  resources=[("Convolution1D", "c", ["c", 1, w, bias])])
    assert e.value.line == 6


def naive_pool1d(x, pool_type, k, stride, pad, out_len):
    """TNN's NaivePooling on the (N, C, L, 1) view, loop for loop: the window clipped to the input."""
    n, ch, length = x.shape
    y = np.zeros((n, ch, out_len))
    for b, c, h in np.ndindex(n, ch, out_len):
        start, end = h * stride - pad, min(h * stride - pad + k, length)
        window = x[b, c, max(start, 0):end].astype(np.float64)
        y[b, c, h] = window.max() if pool_type == 0 else window.sum() / window.size
    return y


@pytest.mark.parametrize("pool_type, k, stride, pad, pad_type, ceil", [
    (0, 3, 2, 1, -1, 0), (1, 3, 2, 1, -1, 0), (1, 4, 3, 1, -1, 1), (0, 2, 2, 0, -1, 1), (1, 3, 1, 0, 0, 0),
    (0, 3, 1, 0, 0, 1), (1, 3, 2, 0, 1, 0), (0, 0, 1, 0, -1, 0), (1, 0, 1, 0, -1, 0)])
def test_pooling1d_matches_tnns_loops(tmp_path, pool_type, k, stride, pad, pad_type, ceil):
    model = tnn_model(tmp_path, IN3, [f"Pooling1D p 1 1 x y {pool_type} {k} {stride} {pad} -1 -1 {pad_type} {ceil}"],
                      "y")
    length, kk = 11, k or 11
    if pad_type == 0:  # SAME, stride 1: out = L, pad_top = ceil((k - 1) / 1)
        out_len, pad = length, kk - 1
    elif pad_type == 1:
        out_len = -(-(length - kk + 1) // stride)
    else:
        rounding = np.ceil if ceil else np.floor
        out_len = int(rounding((length + 2 * pad - kk) / stride + 1))
    want = naive_pool1d(X3, pool_type, kk, stride, pad, out_len)
    np.testing.assert_allclose(run1(model, X3), want, rtol=1e-5, atol=1e-6)


# the last: ceil_mode gives (11 + 2 - 2) / 3 -> 5 windows, the 5th starting at 12, in the end padding
@pytest.mark.parametrize("layer", ["Pooling1D p 1 1 x y 0 3 2 0 -1 -1 0 0", "Pooling1D p 1 1 x y 0 3 1 0 -1 2 -1 0",
                                   "Pooling1D p 1 1 x y 2 3 1 0 -1 -1 -1 0", "Pooling1D p 1 1 x y 0 0 1 1 -1 -1 -1 0",
                                   "Pooling1D p 1 1 x y 1 2 3 1 -1 -1 -1 1"])
def test_pooling1d_variants_tnn_computes_otherwise_are_refused(tmp_path, layer):
    with pytest.raises(UnsupportedOpError, match="Pooling1D") as e:
        tnn_model(tmp_path, IN3, [layer], "y")
    assert "m.tnnproto:6" in str(e.value)


def naive_gather_nd(data, indices):
    """TNN's X86GatherNDLayerAcc: one element per index row, offset = sum of index * stride."""
    flat, strides = data.reshape(-1), [int(np.prod(data.shape[i + 1:])) for i in range(data.ndim)]
    rows = indices.reshape(-1, indices.shape[-1])
    out = [flat[sum(int(i) * st for i, st in zip(row, strides, strict=True))] for row in rows]
    return np.array(out, data.dtype).reshape(indices.shape[:-1])


def test_gather_nd_matches_tnns_loop_with_run_time_and_constant_indices(tmp_path):
    idx = np.stack([RNG.integers(0, d, (3, 5)) for d in X4.shape], -1).astype(np.int32)
    model = tnn_model(tmp_path, f"{IN4} : i 3 3 5 4 3", ["GatherND g 2 1 x i y 0"], "y")
    np.testing.assert_array_equal(run1(model, X4, idx), naive_gather_nd(X4, idx))
    (tmp_path / "c").mkdir()
    model = tnn_model(tmp_path / "c", IN4, ["GatherND g 2 1 x i y"], "y", consts=[("i", idx)])
    np.testing.assert_array_equal(run1(model, X4), naive_gather_nd(X4, idx))


@pytest.mark.parametrize("layer, consts, match", [
    ("GatherND g 2 1 x i y 1", [("i", np.zeros((2, 4), np.int32))], "batch_dims"),
    ("GatherND g 2 1 x i y 0", [("i", np.zeros((2, 2), np.int32))], "single elements")])
def test_gather_nd_variants_tnns_x86_acc_refuses_are_refused(tmp_path, layer, consts, match):
    with pytest.raises(UnsupportedOpError, match=match) as e:
        tnn_model(tmp_path, IN4, [layer], "y", consts=consts)
    assert "m.tnnproto:6" in str(e.value)


def test_gather_nd_constant_index_out_of_range_is_a_format_error_with_line(tmp_path):
    with pytest.raises(ModelFormatError, match="out of") as e:
        tnn_model(tmp_path, IN4, ["GatherND g 2 1 x i y 0"], "y", consts=[("i", np.array([[0, 4, 0, 0]], np.int32))])
    assert e.value.line == 6


def naive_scatter_nd(data, indices, updates):
    """TNN's X86ScatterNDLayerAcc: copy, then memcpy each update slice to the offset its index row gives."""
    out, k = data.copy().reshape(-1), indices.shape[-1]
    counts = [int(np.prod(data.shape[i + 1:])) for i in range(k)]
    size = int(np.prod(data.shape[k:]))
    upd = updates.reshape(-1)
    for i, row in enumerate(indices.reshape(-1, k)):
        offset = sum(int(v) * c for v, c in zip(row, counts, strict=True))
        out[offset:offset + size] = upd[i * size:(i + 1) * size]
    return out.reshape(data.shape)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_scatter_nd_matches_tnns_loop(tmp_path, k):
    idx = np.stack([RNG.integers(0, d, (2, 3)) for d in X4.shape[:k]], -1).astype(np.int32)
    idx[1, 2] = idx[0, 0]  # a repeated index: the later write stays
    upd = RNG.standard_normal((2, 3, *X4.shape[k:])).astype(np.float32)
    inputs = f"{IN4} : u {len(upd.shape)} {' '.join(map(str, upd.shape))} 0"
    model = tnn_model(tmp_path, inputs, ["ScatterND s 2 1 x u y"], "y",
                      resources=[("ScatterND", "s", [True, idx, False])])
    np.testing.assert_array_equal(run1(model, X4, upd), naive_scatter_nd(X4, idx, upd))
    (tmp_path / "three").mkdir()
    model = tnn_model(tmp_path / "three", f"{inputs} : i {idx.ndim} {' '.join(map(str, idx.shape))} 3",
                      ["ScatterND s 3 1 x i u y"], "y")
    np.testing.assert_array_equal(run1(model, X4, upd, idx), naive_scatter_nd(X4, idx, upd))


def test_scatter_nd_negative_constant_index_is_a_format_error_with_line(tmp_path):
    with pytest.raises(ModelFormatError, match="out of") as e:
        tnn_model(tmp_path, f"{IN4} : u 1 1 0", ["ScatterND s 2 1 x u y"], "y",
                  resources=[("ScatterND", "s", [True, np.array([[0, -1, 0, 0]], np.int32), False])])
    assert e.value.line == 6


def naive_scatter(data, indices, updates, axis, add):
    """TNN's CpuScatterLayerAcc / CpuScatterElementsLayerAcc: walk the updates' positions in order, the axis
    coordinate replaced by the index (negative ones wrapped), assign or add."""
    out = data.copy()
    for pos in np.ndindex(*indices.shape):
        at = list(pos)
        i = int(indices[pos])
        at[axis] = i + data.shape[axis] if i < 0 else i
        out[tuple(at)] = out[tuple(at)] + updates[pos] if add else updates[pos]
    return out


@pytest.mark.parametrize("axis", [0, 1, 3, -2])
def test_scatter_matches_tnns_loop(tmp_path, axis):
    dim = X4.shape[axis]
    idx = RNG.integers(-dim, dim, (1, 3, 2, 5)).astype(np.int32)
    upd = RNG.standard_normal(idx.shape).astype(np.float32)
    model = tnn_model(tmp_path, f"{IN4} : u 4 1 3 2 5 0", [f"Scatter s 2 1 x u y {axis}"], "y",
                      resources=[("Scatter", "s", [True, idx, False])])
    np.testing.assert_array_equal(run1(model, X4, upd), naive_scatter(X4, idx, upd, axis, False))


@pytest.mark.parametrize("axis, op", [(0, 0), (2, 0), (3, 1), (1, 1)])
def test_scatter_elements_matches_tnns_loop(tmp_path, axis, op):
    dim = X4.shape[axis]
    idx = RNG.integers(-dim, dim, (1, 3, 2, 5)).astype(np.int32)
    upd = RNG.standard_normal(idx.shape).astype(np.float32)
    inputs = f"{IN4} : i 4 1 3 2 5 3 : u 4 1 3 2 5 0"
    model = tnn_model(tmp_path, inputs, [f"ScatterElements s 3 1 x i u y {axis} {op}"], "y")
    want = naive_scatter(X4, idx, upd, axis, op == 1)
    np.testing.assert_allclose(run1(model, X4, idx, upd), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layer", ["ScatterElements s 3 1 x i u y -1 0", "ScatterElements s 3 1 x i u y 0 2"])
def test_scatter_elements_variants_tnn_computes_otherwise_are_refused(tmp_path, layer):
    with pytest.raises(UnsupportedOpError, match="ScatterElements") as e:
        tnn_model(tmp_path, f"{IN4} : i 4 1 3 2 5 3 : u 4 1 3 2 5 0", [layer], "y")
    assert "m.tnnproto:6" in str(e.value)


def naive_one_hot(indices, depth, axis, off, on, dtype):
    """TNN's X86OneHotLayerAcc: fill with off, then for each index insert it at `axis` and write on (only in-range
    indices here: TNN writes out-of-range ones outside the output)."""
    axis = axis + indices.ndim + 1 if axis < 0 else axis
    shape = list(indices.shape)
    shape.insert(axis, depth)
    out = np.full(shape, off, dtype)
    for pos in np.ndindex(*indices.shape):
        at = list(pos)
        at.insert(axis, int(indices[pos]))
        out[tuple(at)] = on
    return out


@pytest.mark.parametrize("axis", [-1, 0, 1, 2, -3])
def test_one_hot_matches_tnns_loop(tmp_path, axis):
    idx = RNG.integers(0, 5, (3, 4)).astype(np.int32)
    values = np.array([-0.5, 2.0], np.float32)
    model = tnn_model(tmp_path, "i 2 3 4 3", [f"OneHot o 3 1 i d v y {axis} 5 -0.5 2"], "y",
                      consts=[("d", np.array([5], np.int32)), ("v", values)])
    out = run1(model, idx)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, naive_one_hot(idx, 5, axis, -0.5, 2.0, np.float32))


def test_one_hot_without_values_is_int32_and_wraps_negative_indices(tmp_path):
    idx = np.array([[0, -1, 2], [3, -4, 1]], np.int32)
    model = tnn_model(tmp_path, "i 2 2 3 3", ["OneHot o 1 1 i y -1 4"], "y")
    out = run1(model, idx)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, naive_one_hot(idx % 4, 4, -1, 0, 1, np.int32))


def test_one_hot_of_a_huge_depth_is_refused_before_its_classes_are_made(tmp_path):
    """A depth of 2**31 - 1 from the file: its constant of class numbers would be 8 GiB at load; refused, naming the
    layer's line."""
    with pytest.raises(ModelFormatError, match="depth 2147483647, more than") as e:
        tnn_model(tmp_path, "i 2 2 3 3", ["OneHot o 1 1 i y -1 2147483647"], "y")
    assert "m.tnnproto:6" in str(e.value)


@pytest.mark.parametrize("layer, consts", [
    ("OneHot o 1 1 i y -1 -1", []),
    ("OneHot o 3 1 i d v y -1 5", [("d", np.array([5], np.int32)), ("v", np.array([-1, 1], np.float32))])])
def test_one_hot_variants_tnn_computes_otherwise_are_refused(tmp_path, layer, consts):
    with pytest.raises(UnsupportedOpError, match="OneHot") as e:
        tnn_model(tmp_path, "i 2 3 4 3", [layer], "y", consts=consts)
    assert "m.tnnproto:6" in str(e.value)


@pytest.mark.parametrize("start, limit, delta", [(0.5, 3.2, 0.7), (2.0, -1.0, -0.5), (1, 13, 3), (5, 5, 1)])
def test_range_matches_tnns_loop(tmp_path, start, limit, delta):
    dtype = np.float32 if isinstance(start, float) else np.int32
    consts = [(n, np.array([v], dtype)) for n, v in (("s", start), ("l", limit), ("d", delta))]
    model = tnn_model(tmp_path, IN4, ["Range r 3 1 s l d y", "Add a 2 1 x x z"], "y z", consts=consts)
    out = model.instance().run({"x": X4})["y"]
    # TNN: count = ceil((limit - start) / delta) (float32 or int32 arithmetic), y[i] = start + i * delta
    s, lim, d = (dtype(v) for v in (start, limit, delta))
    count = max(int(np.ceil(np.float32((lim - s) / d))) if dtype is np.float32 else int((lim - s) / d), 0)
    want = np.array([s + dtype(i) * d for i in range(count)], dtype)
    assert out.dtype == dtype
    np.testing.assert_allclose(out, want, rtol=1e-6)


@pytest.mark.parametrize("consts, inputs", [
    ([("s", np.array([0], np.int32)), ("l", np.array([5], np.int32)), ("d", np.array([2], np.int32))], IN4),
    ([("s", np.array([0], np.int32)), ("l", np.array([5.0], np.float32)), ("d", np.array([1], np.int32))], IN4),
    ([("s", np.array([0], np.int32)), ("d", np.array([1], np.int32))], f"{IN4} : l 1 1 3")])
def test_range_variants_tnn_computes_otherwise_or_unbounded_are_refused(tmp_path, consts, inputs):
    with pytest.raises(UnsupportedOpError, match="Range") as e:
        tnn_model(tmp_path, inputs, ["Range r 3 1 s l d y", "Add a 2 1 x x z"], "y z", consts=consts)
    assert "m.tnnproto:6" in str(e.value)


@pytest.mark.parametrize("direction, bits", [(0, 0), (0, 3), (1, 5), (0, 31), (1, 31)])
@pytest.mark.parametrize("code, dtype", [(3, np.int32), (6, np.uint32)])
def test_bit_shift_matches_tnns_unsigned_loop(tmp_path, direction, bits, code, dtype):
    x = np.array([[0, 1, -1, 7, 2 ** 31 - 1, -(2 ** 31), 12345, -98765]]).astype(dtype)
    model = tnn_model(tmp_path, f"x 2 1 8 {code}", [f"BitShift b 1 1 x y {direction} {bits}"], "y")
    # TNN: output_data[i] = (unsigned int) input_data[i] >> bits (or << bits), one element at a time
    want = np.array([((int(v) & 0xFFFFFFFF) >> bits if direction == 0 else (int(v) << bits) & 0xFFFFFFFF)
                     for v in x.reshape(-1).astype(np.int64)], np.uint32).view(dtype).reshape(x.shape)
    out = run1(model, x)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("layer, inputs", [("BitShift b 1 1 x y 0 32", "x 2 1 8 3"),
                                           ("BitShift b 1 1 x y 0 1", "x 2 1 8 0")])
def test_bit_shift_variants_are_refused(tmp_path, layer, inputs):
    with pytest.raises(UnsupportedOpError, match="BitShift") as e:
        tnn_model(tmp_path, inputs, [layer], "y")
    assert "m.tnnproto:6" in str(e.value)


def naive_signed_mul(x, alpha, beta, gamma):
    """TNN's X86SignedMulLayerAcc, loop for loop, in float32."""
    x = x.astype(np.float32)
    n, ch = x.shape[:2]
    t = x.reshape(n, ch, -1).copy()
    gamma_inv = np.float32(1.0) / np.float32(gamma)
    for b, c, i in np.ndindex(*t.shape):
        temp = t[b, c, i] - np.float32(alpha)
        temp = np.float32(1) if temp > 0 else np.float32(-1) if temp < 0 else temp
        t[b, c, i] = (temp + np.float32(beta)) * gamma_inv
    for b in range(n):
        for c in range(ch - 1, -1, -1):
            t[b, c] *= t[b, 0]
    return t.reshape(x.shape)


@pytest.mark.parametrize("alpha, beta, gamma", [(0.0, 1.0, 2.0), (0.3, -0.5, 0.7), (-1.0, 0.0, 1.0)])
def test_signed_mul_matches_tnns_loop(tmp_path, alpha, beta, gamma):
    x = X4.copy()
    x[0, :, 0, 0] = alpha  # sign(0) stays 0
    model = tnn_model(tmp_path, IN4, [f"SignedMul s 1 1 x y {alpha} {beta} {gamma}"], "y")
    np.testing.assert_allclose(run1(model, x), naive_signed_mul(x, alpha, beta, gamma), rtol=1e-6, atol=1e-7)


def naive_inverse(x):
    """TNN's CpuInverseLayerAcc: per 2x2 matrix, det in float32, its inverse times the adjugate."""
    out = np.empty_like(x).reshape(-1, 4)
    for k, (a, b, c, d) in enumerate(x.reshape(-1, 4).astype(np.float32)):
        det_inv = np.float32(1.0) / (a * d - b * c)
        out[k] = [d * det_inv, -b * det_inv, -c * det_inv, a * det_inv]
    return out.reshape(x.shape)


def test_inverse_matches_tnns_loop_and_numpys_inverse(tmp_path):
    x = RNG.standard_normal((3, 4, 2, 2)).astype(np.float32)
    model = tnn_model(tmp_path, "x 4 3 4 2 2 0", ["Inverse i 1 1 x y"], "y")
    out = run1(model, x)
    np.testing.assert_allclose(out, naive_inverse(x), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out, np.linalg.inv(x), rtol=1e-3, atol=1e-3)


def test_inverse_of_other_than_2x2_is_refused(tmp_path):
    with pytest.raises(UnsupportedOpError, match="Inverse") as e:
        tnn_model(tmp_path, "x 3 2 3 3 0", ["Inverse i 1 1 x y"], "y")
    assert "m.tnnproto:6" in str(e.value)


def naive_grid_sample(x, grid):
    """TNN's CpuGridSampleLayerAcc (bilinear, zeros, align_corners 0), loop for loop in float32."""
    n, ch, ih, iw = x.shape
    _, oh, ow, _ = grid.shape
    out = np.zeros((n, ch, oh, ow), np.float32)
    f32 = np.float32
    for b, h, w in np.ndindex(n, oh, ow):
        gx, gy = grid[b, h, w]
        ix = f32((f32(gx) + 1) * iw * 0.5 - 0.5)
        iy = f32((f32(gy) + 1) * ih * 0.5 - 0.5)
        x0, y0 = int(np.floor(ix)), int(np.floor(iy))
        taps = [(y0, x0, (x0 + 1 - ix) * (y0 + 1 - iy)), (y0, x0 + 1, (ix - x0) * (y0 + 1 - iy)),
                (y0 + 1, x0, (x0 + 1 - ix) * (iy - y0)), (y0 + 1, x0 + 1, (ix - x0) * (iy - y0))]
        for yy, xx, weight in taps:
            if 0 <= yy < ih and 0 <= xx < iw:
                out[b, :, h, w] += x[b, :, yy, xx] * f32(weight)
    return out


def test_grid_sample_matches_tnns_loop(tmp_path):
    grid = RNG.uniform(-1.3, 1.3, (1, 5, 7, 2)).astype(np.float32)  # some samples fall outside the input
    model = tnn_model(tmp_path, f"{IN4} : g 4 1 5 7 2 0", ["GridSample s 2 1 x g y 2 0 0"], "y")
    np.testing.assert_allclose(run1(model, X4, grid), naive_grid_sample(X4, grid), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("params", ["1 0 0", "2 1 0", "2 0 1"])
def test_grid_sample_variants_tnns_acc_refuses_are_refused(tmp_path, params):
    with pytest.raises(UnsupportedOpError, match="GridSample") as e:
        tnn_model(tmp_path, f"{IN4} : g 4 1 5 7 2 0", [f"GridSample s 2 1 x g y {params}"], "y")
    assert "m.tnnproto:6" in str(e.value)


def brute_einsum(equation, a, b):
    """Two-operand einsum by its definition: for every assignment of the labels, out[out labels] += a * b."""
    lhs, rhs = equation.split("->")
    ta, tb = lhs.split(",")
    sizes = dict(zip(ta, a.shape, strict=True)) | dict(zip(tb, b.shape, strict=True))
    labels = sorted(sizes)
    out = np.zeros([sizes[label] for label in rhs])
    for values in np.ndindex(*[sizes[label] for label in labels]):
        at = dict(zip(labels, values, strict=True))
        out[tuple(at[label] for label in rhs)] += (float(a[tuple(at[label] for label in ta)])
                                                   * float(b[tuple(at[label] for label in tb)]))
    return out


@pytest.mark.parametrize("equation, sa, sb", [
    ("bij,bjk->bik", (2, 3, 4), (2, 4, 5)), ("bhqd,bhkd->bhqk", (1, 2, 3, 4), (1, 2, 5, 4)),
    ("i,j->ij", (3,), (4,)), ("ij,jk->ki", (3, 4), (4, 2)), ("bi,bi->b", (3, 4), (3, 4))])
def test_einsum_matches_the_definition(tmp_path, equation, sa, sb):
    a, b = RNG.standard_normal(sa).astype(np.float32), RNG.standard_normal(sb).astype(np.float32)
    inputs = f"a {len(sa)} {' '.join(map(str, sa))} 0 : b {len(sb)} {' '.join(map(str, sb))} 0"
    model = tnn_model(tmp_path, inputs, [f"Einsum e 2 1 a b y {equation.replace(',', ';')}"], "y")
    np.testing.assert_allclose(run1(model, a, b), brute_einsum(equation, a, b), rtol=1e-5, atol=1e-5)


def test_einsum_full_contraction_is_tnns_dot_of_shape_1(tmp_path):
    a, b = RNG.standard_normal((3, 4)).astype(np.float32), RNG.standard_normal((3, 4)).astype(np.float32)
    model = tnn_model(tmp_path, "a 2 3 4 0 : b 2 3 4 0", ["Einsum e 2 1 a b y ij;ij->"], "y")
    out = run1(model, a, b)
    assert out.shape == (1,)
    np.testing.assert_allclose(out, [float((a.astype(np.float64) * b).sum())], rtol=1e-5)


@pytest.mark.parametrize("layer", ["Einsum e 2 1 a b y ijk;ijk->i", "Einsum e 2 1 a b y ii;ij->j",
                                   "Einsum e 2 1 a b y iJ;Jk->ik", "Einsum e 1 1 a y ijk->kji"])
def test_einsum_variants_tnns_acc_computes_otherwise_are_refused(tmp_path, layer):
    with pytest.raises(UnsupportedOpError, match="Einsum") as e:
        tnn_model(tmp_path, "a 3 3 3 3 0 : b 3 3 3 3 0", [layer], "y")
    assert "m.tnnproto:6" in str(e.value)


@pytest.mark.parametrize("alias, base", [
    ("Pooling_nhwc p 1 1 x y 0 2 2 2 2 0 0 -1 -1 -1 0 0", "Pooling p 1 1 x y 0 2 2 2 2 0 0 -1 -1 -1 0 0"),
    ("Pooling_split_CC p 1 1 x y 1 3 3 1 1 1 1 -1 -1 -1 0 0", "Pooling p 1 1 x y 1 3 3 1 1 1 1 -1 -1 -1 0 0"),
    ("Softmax_nhwc s 1 1 x y 1", "Softmax s 1 1 x y 1"), ("Flatten_nhwc f 1 1 x y 1", "Flatten f 1 1 x y 1"),
    ("Concat_nhwc c 2 1 x x y 1", "Concat c 2 1 x x y 1"), ("Reduce_Sum r 1 1 x y 0 1", "ReduceSum r 1 1 x y 0 1"),
    ("StridedSlice_nhwc s 1 1 x y 4 0 1 0 0 4 0 3 0 -1 4 1 1 1 2",
     "StridedSlice s 1 1 x y 4 0 1 0 0 4 0 3 0 -1 4 1 1 1 2")])
def test_tnns_other_spellings_of_a_type_run_as_that_type(tmp_path, alias, base):
    """TNN maps both strings to one LayerType (layer_type.cc) and reads and runs the layer by that alone."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    want = run1(tnn_model(tmp_path / "b", IN4, [base], "y"), X4)
    np.testing.assert_array_equal(run1(tnn_model(tmp_path / "a", IN4, [alias], "y"), X4), want)


def test_tnns_other_spellings_read_their_resources(tmp_path):
    w, bias, slope = (RNG.standard_normal(n).astype(np.float32) for n in (4 * 4 * 9, 4, 4))
    layers = ["Convolution_nhwc c 1 1 x t 1 4 4 3 3 1 1 1 1 1 -1 1 1", "PReLU_nhwc p 1 1 t y 0 0"]
    model = tnn_model(tmp_path, IN4, layers, "y", resources=[("Convolution_nhwc", "c", ["c", 1, w, bias]),
                                                             ("PReLU_nhwc", "p", ["p", slope])])
    (tmp_path / "b").mkdir()
    base = tnn_model(tmp_path / "b", IN4, [layer.replace("_nhwc", "") for layer in layers], "y",
                     resources=[("Convolution", "c", ["c", 1, w, bias]), ("PReLU", "p", ["p", slope])])
    np.testing.assert_array_equal(run1(model, X4), run1(base, X4))


@pytest.mark.parametrize("layer, reason", [("Deconvolution3D d 1 1 x y", "TNN cannot load it"),
                                           ("Reformat r 1 1 x y 0 1", "TNN's runtime inserts")])
def test_types_refused_on_purpose_say_why(tmp_path, layer, reason):
    with pytest.raises(UnsupportedOpError, match=reason) as e:
        tnn_model(tmp_path, IN4, [layer], "y")
    assert "m.tnnproto:6" in str(e.value)


def test_scatters_of_other_than_float32_data_are_refused(tmp_path):
    with pytest.raises(UnsupportedOpError, match="int32 data") as e:
        tnn_model(tmp_path, "x 2 3 4 3 : i 2 3 4 3 : u 2 3 4 3", ["ScatterElements s 3 1 x i u y 0 0"], "y")
    assert "m.tnnproto:6" in str(e.value)
