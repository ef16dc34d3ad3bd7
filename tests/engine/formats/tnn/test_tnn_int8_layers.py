"""TNN's int8 Permute, Reshape and Sigmoid (and the refused cubic int8 Upsample) on hand-made quantized models,
against references that follow TNN's naive CPU accs step by step: the input quantized with its blob scale (round
half away from zero, saturated), bytes moved unchanged by Permute / Reshape, Sigmoid computed in float32 per channel
and requantized, the result read with the output blob's scale."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import UnsupportedOpError
from tests.engine.formats.tnn.test_tnn_int8 import quantized_model, round_away

RNG = np.random.default_rng(17)
F32 = np.float32
S_X = F32([0.02, 0.03, 0.05])
CH = S_X.reshape(1, 3, 1, 1)


def _input():
    return RNG.standard_normal((1, 3, 5, 5)).astype(F32)


def test_quantized_permute_moves_the_int8_values_and_reads_them_with_the_output_scale(tmp_path):
    s_y = F32([0.04])
    model = quantized_model(tmp_path, ["QuantizedPermute p 1 1 x y 4 0 2 3 1"], [], {"x": S_X, "y": s_y})
    x = _input()
    expected = round_away(x / CH).transpose(0, 2, 3, 1).astype(F32) * s_y
    np.testing.assert_array_equal(model.instance().run({"x": x})["y"], expected)


@pytest.mark.parametrize("ltype", ["QuantizedReshape", "QuantizedReshapeTensorflow"])
def test_quantized_reshape_copies_the_int8_values(tmp_path, ltype):
    s_y = F32([0.03])
    model = quantized_model(tmp_path, [f"{ltype} r 1 1 x y 0 -1 4 1 15 5 1 0"], [], {"x": S_X, "y": s_y})
    x = _input()
    expected = round_away(x / CH).reshape(1, 15, 5, 1).astype(F32) * s_y
    np.testing.assert_array_equal(model.instance().run({"x": x})["y"], expected)


def test_quantized_sigmoid_requantizes_per_channel_in_float32(tmp_path):
    s_y = F32([1 / 127, 1 / 100, 1 / 90])
    model = quantized_model(tmp_path, ["QuantizedSigmoid s 1 1 x y"], [], {"x": S_X, "y": s_y})
    x = _input() * 3
    real = round_away(x / CH).astype(F32) * CH
    sig = (F32(1) / (F32(1) + np.exp(-real))).astype(F32)
    expected = round_away(sig / s_y.reshape(1, 3, 1, 1)).astype(F32) * s_y.reshape(1, 3, 1, 1)
    np.testing.assert_array_equal(model.instance().run({"x": x})["y"], expected)


@pytest.mark.parametrize("layer, scales, words", [
    ("QuantizedReshape odd 1 1 x1 y 0 -1 4 1 15 5 1 1", {}, "reshape_type 1"),
    ("QuantizedReshapeTensorflow odd 1 1 x1 y 0 -1 4 1 15 5 1 1", {}, "reshape_type 1"),
    ("QuantizedSigmoid odd 1 1 x1 y", {"y": F32([0.01])}, "1 output scale(s) for 3 channels"),
    ("QuantizedSigmoid odd 1 1 x1 y", {"y": F32([0.01, 0, 0.01])}, "zero output scale"),
    ("QuantizedUpsample odd 1 1 x1 y 3 2 2 0", {}, "cubic"),
    ("QuantizedReshape odd 2 1 x1 x y 0 -1 4 1 15 5 1 0", {}, "shape input"),
])
def test_int8_variants_tnn_does_not_define_are_refused_with_file_and_line(tmp_path, layer, scales, words):
    scales = {"x": S_X, "x1": S_X, "y": F32([0.02, 0.02, 0.02])} | scales
    with pytest.raises(UnsupportedOpError) as e:
        quantized_model(tmp_path, ["QuantizedReLU r 1 1 x x1", layer], [], scales)
    assert layer.split()[0] in str(e.value) and "odd" in str(e.value) and "q.tnnproto:7" in str(e.value)
    assert words in str(e.value)


def test_int8_sigmoid_of_a_blob_other_than_4d_is_refused(tmp_path):
    with pytest.raises(UnsupportedOpError) as e:
        quantized_model(tmp_path, ["QuantizedReLU r 1 1 x x1", "QuantizedSigmoid odd 1 1 x1 y"], [],
                        {"x": S_X, "x1": S_X, "y": S_X}, inputs="x 3 1 3 5")
    assert "QuantizedSigmoid" in str(e.value) and "q.tnnproto:7" in str(e.value) and "4-D" in str(e.value)
