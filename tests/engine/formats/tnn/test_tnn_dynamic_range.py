"""TNN's DynamicRangeQuantized* layers: float layers whose weights are stored int8 with float scales, dequantized
at load as TNN's NetOptimizerDynamicRangeDequant does (w = scale * (float)q in float32), then run as the float
layer. References: numpy on the weights dequantized here; and the load-time refusals of what TNN leaves int8."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from engine.errors import UnsupportedOpError
from tests.engine.formats.tnn.test_tnn_lowering import IN4, X4, run1, tnn_model
from tests.engine.formats.tnn.test_tnn_lstm import B, H, I, T, onnx_lstm

RNG = np.random.default_rng(23)
F32 = np.float32


def _q(shape) -> np.ndarray:
    return RNG.integers(-127, 128, shape).astype(np.int8)


def test_conv_filter_is_dequantized_per_output_channel(tmp_path):
    q, scale, bias = _q((5, 4, 3, 3)), RNG.uniform(0.001, 0.02, 5).astype(F32), RNG.standard_normal(5).astype(F32)
    layer = "DynamicRangeQuantizedConvolution c 1 1 x y 1 4 5 3 3 1 1 0 0 1 -1 1 1"
    model = tnn_model(tmp_path, IN4, [layer], "y",
                      [("DynamicRangeQuantizedConvolution", "c", ["c", 1, q, bias, scale])])
    w = scale.reshape(5, 1, 1, 1) * q.astype(F32)
    win = sliding_window_view(X4.astype(np.float64), (3, 3), axis=(2, 3))  # (1, 4, 4, 6, 3, 3)
    ref = np.einsum("nchwij,ocij->nohw", win, w.astype(np.float64)) + bias.reshape(1, 5, 1, 1)
    np.testing.assert_allclose(run1(model, X4), ref, rtol=1e-5, atol=1e-5)


def test_inner_product_weight_is_dequantized_with_its_first_scale(tmp_path):
    q, bias = _q((5, 192)), RNG.standard_normal(5).astype(F32)
    layer = "DynamicRangeQuantizedInnerProduct ip 1 1 x y 5 1 0 1"
    model = tnn_model(tmp_path, IN4, [layer], "y",
                      [("DynamicRangeQuantizedInnerProduct", "ip", ["ip", q, bias, F32([0.004])])])
    ref = X4.reshape(1, -1).astype(np.float64) @ (F32(0.004) * q.astype(F32)).T.astype(np.float64) + bias
    np.testing.assert_allclose(run1(model, X4), ref.reshape(1, 5, 1, 1), rtol=1e-5, atol=1e-5)


def test_matmul_stored_weight_is_dequantized(tmp_path):
    q = _q((8, 3))
    model = tnn_model(tmp_path, IN4, ["DynamicRangeQuantizedMatMul m 1 1 x y 1"], "y",
                      [("DynamicRangeQuantizedMatMul", "m", [q, F32([0.01])])])
    np.testing.assert_allclose(run1(model, X4), X4 @ (F32(0.01) * q.astype(F32)), rtol=1e-5, atol=1e-5)


def test_matmul_constant_operand_is_dequantized_with_its_constant_map_scale(tmp_path):
    q = _q((8, 3))
    consts = [("w", q), ("w_dynamic_range_quant_scale", F32([0.02]))]
    model = tnn_model(tmp_path, IN4, ["DynamicRangeQuantizedMatMul m 2 1 x w y -1"], "y", consts=consts)
    np.testing.assert_allclose(run1(model, X4), X4 @ (F32(0.02) * q.astype(F32)), rtol=1e-5, atol=1e-5)


def test_gather_data_is_dequantized_per_row(tmp_path):
    q, scale = _q((6, 4)), RNG.uniform(0.01, 0.1, 6).astype(F32)
    model = tnn_model(tmp_path, "x 2 2 3 3", ["DynamicRangeQuantizedGather g 1 1 x y 0 1 0"], "y",
                      [("DynamicRangeQuantizedGather", "g", [1, q, 0, scale])])
    idx = np.array([[0, 5, 2], [3, 3, 1]], np.int32)
    np.testing.assert_array_equal(run1(model, idx), (scale[:, None] * q.astype(F32))[idx])


def test_lstm_w_and_r_are_dequantized_per_tensor(tmp_path):
    w, r = _q((2, 4 * H, I)), _q((2, 4 * H, H))
    b = RNG.standard_normal((2, 8 * H)).astype(F32)
    consts = [("w", w), ("r", r), ("b", b), ("w_dynamic_range_quant_scale", F32([0.01])),
              ("r_dynamic_range_quant_scale", F32([0.005]))]
    layer = f"DynamicRangeQuantizedLSTMONNX l 4 3 x w r b y yh yc 0 {H} 2"
    model = tnn_model(tmp_path, f"x 3 {T} {B} {I} 0", [layer], "y yh yc", consts=consts)
    x = RNG.standard_normal((T, B, I)).astype(F32)
    out = model.instance().run({"x": x})
    zeros = np.zeros((2, B, H), F32)
    ref = onnx_lstm(x, F32(0.01) * w.astype(F32), F32(0.005) * r.astype(F32), b, zeros, zeros, 2)
    for name, want in zip(("y", "yh", "yc"), ref, strict=True):
        np.testing.assert_allclose(out[name], want, rtol=1e-5, atol=1e-5)


def test_float_weights_in_a_dynamic_range_layer_run_as_stored(tmp_path):
    """TNN's pass skips a weight that is not int8 (already dequantized)."""
    w = RNG.standard_normal((8, 3)).astype(F32)
    model = tnn_model(tmp_path, IN4, ["DynamicRangeQuantizedMatMul m 1 1 x y 1"], "y",
                      [("DynamicRangeQuantizedMatMul", "m", [w])])
    np.testing.assert_allclose(run1(model, X4), X4 @ w, rtol=1e-5, atol=1e-5)


def _lstm_consts(w_int8: bool, r_int8: bool):
    w = _q((1, 4 * H, I)) if w_int8 else RNG.standard_normal((1, 4 * H, I)).astype(F32)
    r = _q((1, 4 * H, H)) if r_int8 else RNG.standard_normal((1, 4 * H, H)).astype(F32)
    return [("w", w), ("r", r), ("b", np.zeros((1, 8 * H), F32)), ("w_dynamic_range_quant_scale", F32([0.01])),
            ("r_dynamic_range_quant_scale", F32([0.01]))]


@pytest.mark.parametrize("layer, resources, consts, inputs, words", [
    ("DynamicRangeQuantizedMatMul odd 1 1 x1 y 0",
     [("DynamicRangeQuantizedMatMul", "odd", [_q((6, 4)), F32([0.1])])], [], IN4, "position 0"),
    ("DynamicRangeQuantizedGather odd 1 1 x1 y 0 1 0",
     [("DynamicRangeQuantizedGather", "odd", [1, _q((6, 4)), 0, F32([0.1, 0.2])])], [], "x 2 2 3 3", "2 scales"),
    ("DynamicRangeQuantizedConvolution odd 1 1 x1 y 1 4 5 3 3 1 1 0 0 0 -1 1 1",
     [("DynamicRangeQuantizedConvolution", "odd", ["odd", 0, _q((5, 4, 3, 3)), _q((5,)), F32([0.1] * 5)])], [],
     IN4, "zero points"),
    (f"DynamicRangeQuantizedLSTMONNX odd 4 3 x1 w r b y yh yc 0 {H} 0", [], _lstm_consts(False, True),
     f"x 3 {T} {B} {I} 0", "float W and an int8 R"),
])
def test_int8_weights_tnn_leaves_int8_are_refused_with_file_and_line(tmp_path, layer, resources, consts, inputs,
                                                                     words):
    outputs = "y yh yc" if "LSTM" in layer else "y"
    with pytest.raises(UnsupportedOpError) as e:
        tnn_model(tmp_path, inputs, ["Abs a 1 1 x x1", layer], outputs, resources, consts=consts)
    assert layer.split()[0] in str(e.value) and "odd" in str(e.value) and "m.tnnproto:7" in str(e.value)
    assert words in str(e.value)


def test_int8_filter_of_a_v1_file_without_dims_is_refused(tmp_path):
    """TNN's pass takes the filter's first stored dim as its output channels; a v1 buffer stores no dims."""
    layer = "DynamicRangeQuantizedConvolution odd 1 1 x1 y 1 4 5 3 3 1 1 0 0 0 -1 1 1"
    res = [("DynamicRangeQuantizedConvolution", "odd", ["odd", 0, _q((5, 4, 3, 3)), F32([0.1] * 5)])]
    with pytest.raises(UnsupportedOpError) as e:
        tnn_model(tmp_path, IN4, ["Abs a 1 1 x x1", layer], "y", res, version=1)
    assert "DynamicRangeQuantizedConvolution" in str(e.value) and "m.tnnproto:7" in str(e.value)
    assert "without dims" in str(e.value)


def test_one_dimensional_int8_gather_data_is_refused(tmp_path):
    layer = "DynamicRangeQuantizedGather odd 1 1 x1 y 0 1 0"
    res = [("DynamicRangeQuantizedGather", "odd", [1, _q((6,)), 0, F32([0.1] * 6)])]
    with pytest.raises(UnsupportedOpError) as e:
        tnn_model(tmp_path, "x 2 2 3 3", ["Abs a 1 1 x x1", layer], "y", res)
    assert "DynamicRangeQuantizedGather" in str(e.value) and "m.tnnproto:7" in str(e.value)
    assert "1-D int8 data" in str(e.value)


@pytest.mark.parametrize("layer, resources, inputs", [
    ("Convolution odd 1 1 x1 y 1 4 5 3 3 1 1 0 0 0 -1 1 1", [("Convolution", "odd", ["odd", 0, _q((5, 4, 3, 3)),
                                                                                F32([0.1] * 5)])], IN4),
    ("InnerProduct odd 1 1 x1 y 5 0 0 1", [("InnerProduct", "odd", ["odd", _q((5, 192)), np.zeros(0, F32),
                                                                         F32([0.1])])], IN4),
    ("MatMul odd 1 1 x1 y 1", [("MatMul", "odd", [_q((8, 3)), F32([0.1])])], IN4),
    ("Gather odd 1 1 x1 y 0 1 0", [("Gather", "odd", [1, _q((6, 4)), 0, F32([0.1] * 6)])], "x 2 2 3 3"),
])
def test_int8_weights_of_a_float_layer_are_refused(tmp_path, layer, resources, inputs):
    """Only Quantized* and DynamicRangeQuantized* layers give int8 weights their scales."""
    with pytest.raises(UnsupportedOpError) as e:
        tnn_model(tmp_path, inputs, ["Abs a 1 1 x x1", layer], "y", resources)
    assert layer.split()[0] in str(e.value) and "m.tnnproto:7" in str(e.value) and "int8" in str(e.value)
