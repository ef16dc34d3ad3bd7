"""TNN's int8 Permute and Reshape (and the refused int8 Sigmoid and cubic Upsample) on hand-made quantized models,
against references that follow TNN's x86 accs step by step: the input quantized with its blob scale (round half
away from zero, saturated) into TNN x86's NHWC4 int8 buffer, the bytes moved as X86Permute<int8_t>
(source/tnn/device/x86/acc/x86_permute_layer_acc.cc) and X86ReshapeLayerAcc's memcpy
(source/tnn/device/x86/acc/x86_reshape_layer_acc.cc) move them, the output buffer read as NHWC4 with the output
blob's scale."""

from __future__ import annotations

import numpy as np
import pytest

from engine.devices.cpu.options import CpuOptions
from engine.errors import UnsupportedOpError
from engine.runtime.options import EngineOptions
from tests.engine.formats.tnn.test_tnn_int8 import quantized_model, round_away

RNG = np.random.default_rng(17)
F32 = np.float32
S_X = F32([0.02, 0.03, 0.05])
LAYOUTS = {"nhwc": EngineOptions(cpu=CpuOptions(onednn=True)), "nchw": EngineOptions(cpu=CpuOptions(onednn=False))}
S_X8 = F32([0.02, 0.03, 0.05, 0.04, 0.01, 0.06, 0.025, 0.035])
CH8 = S_X8.reshape(1, 8, 1, 1)
PAD = -77  # what a producer might leave in the NHWC4 padding bytes


def _nhwc4_buffer(q: np.ndarray) -> np.ndarray:
    """TNN x86's int8 blob memory: N, H, W, ROUND_UP(C, 4) (X86Device::Calculate1DMemorySize)."""
    n, c, h, w = q.shape
    buf = np.full((n, h, w, -(-c // 4) * 4), PAD, np.int8)
    buf[..., :c] = q.transpose(0, 2, 3, 1)
    return buf.reshape(-1)


def _read_nhwc4(buf: np.ndarray, dims) -> np.ndarray:
    n, c, h, w = dims
    return buf.reshape(n, h, w, -(-c // 4) * 4)[..., :c].transpose(0, 3, 1, 2)


def _count(dims, start):
    return int(np.prod(dims[start:], dtype=np.int64))


def _x86_permute(q: np.ndarray, order) -> np.ndarray:
    """X86Permute<int8_t> (x86_permute_layer_acc.cc, num_axes 4) on the NHWC4 buffers, loop for loop."""
    in_dims = list(q.shape)
    out_dims = [in_dims[k] for k in order]
    old_steps = [_count(in_dims, i + 1) for i in range(4)]
    new_steps = [_count(out_dims, i + 1) for i in range(4)]
    bottom = _nhwc4_buffer(q)
    top = np.full(out_dims[0] * -(-out_dims[1] // 4) * 4 * out_dims[2] * out_dims[3], PAD, np.int8)
    for n in range(out_dims[0]):
        for c in range(out_dims[1]):
            for h in range(out_dims[2]):
                for w in range(out_dims[3]):
                    idx = n * new_steps[0] + c * new_steps[1] + h * new_steps[2] + w * new_steps[3]
                    old = (n * old_steps[order[0]] + c * old_steps[order[1]] + h * old_steps[order[2]]
                           + w * old_steps[order[3]])
                    top[idx] = bottom[old]
    return _read_nhwc4(top, out_dims)


def _x86_reshape(q: np.ndarray, out_dims) -> np.ndarray:
    """X86ReshapeLayerAcc, reshape_type 0: memcpy of Count(input dims) bytes between the NHWC4 buffers."""
    bottom = _nhwc4_buffer(q)
    top = np.full(out_dims[0] * -(-out_dims[1] // 4) * 4 * out_dims[2] * out_dims[3], PAD, np.int8)
    top[:q.size] = bottom[:q.size]
    return _read_nhwc4(top, out_dims)


def _input8():
    return RNG.standard_normal((1, 8, 4, 4)).astype(F32)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("order", [(0, 2, 3, 1), (0, 1, 3, 2), (0, 3, 1, 2), (0, 1, 2, 3)])
def test_quantized_permute_moves_the_nhwc4_bytes_as_tnn_x86_does(tmp_path, order, layout):
    s_y = F32([0.04])
    model = quantized_model(tmp_path, [f"QuantizedPermute p 1 1 x y 4 {' '.join(map(str, order))}"], [],
                            {"x": S_X8, "y": s_y}, inputs="x 4 1 8 4 4")
    x = _input8()
    expected = _x86_permute(round_away(x / CH8), order).astype(F32) * s_y
    np.testing.assert_array_equal(model.instance(options=LAYOUTS[layout]).run({"x": x})["y"], expected)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("orders, order", [("2 0 2", (0, 2, 1, 3)), ("2 0 3", (0, 3, 1, 2))])
def test_quantized_permute_completes_partial_orders_as_tnn_does(tmp_path, orders, order, layout):
    """Fewer orders than axes: TNN appends the axes left out in ascending order (PermuteLayer::InferOutputShape)."""
    s_y = F32([0.04])
    model = quantized_model(tmp_path, [f"QuantizedPermute p 1 1 x y {orders}"], [], {"x": S_X8, "y": s_y},
                            inputs="x 4 1 8 4 4")
    x = _input8()
    expected = _x86_permute(round_away(x / CH8), order).astype(F32) * s_y
    np.testing.assert_array_equal(model.instance(options=LAYOUTS[layout]).run({"x": x})["y"], expected)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("ltype", ["QuantizedReshape", "QuantizedReshapeTensorflow"])
@pytest.mark.parametrize("shape, dims", [("4 1 16 2 4", (1, 16, 2, 4)), ("4 0 4 -1 8", (1, 4, 4, 8)),
                                         ("4 1 8 4 4", (1, 8, 4, 4))])
def test_quantized_reshape_copies_the_nhwc4_bytes_as_tnn_x86_does(tmp_path, ltype, shape, dims, layout):
    s_y = F32([0.03])
    model = quantized_model(tmp_path, [f"{ltype} r 1 1 x y 0 -1 {shape} 0"], [], {"x": S_X8, "y": s_y},
                            inputs="x 4 1 8 4 4")
    x = _input8()
    expected = _x86_reshape(round_away(x / CH8), dims).astype(F32) * s_y
    out = model.instance(options=LAYOUTS[layout]).run({"x": x})["y"]
    assert out.shape == dims
    np.testing.assert_array_equal(out, expected)


def test_quantized_reshape_is_not_the_nchw_reshape(tmp_path):
    """The x86 memcpy keeps the NHWC byte order: a flatten to channels is not NCHW's (the old, wrong reading)."""
    model = quantized_model(tmp_path, ["QuantizedReshape r 1 1 x y 0 -1 4 1 128 1 1 0"], [],
                            {"x": S_X8, "y": F32([0.03])}, inputs="x 4 1 8 4 4")
    x = _input8()
    q = round_away(x / CH8)
    out = model.instance().run({"x": x})["y"]
    np.testing.assert_array_equal(out, q.transpose(0, 2, 3, 1).reshape(1, 128, 1, 1).astype(F32) * F32(0.03))
    assert not np.array_equal(out, q.reshape(1, 128, 1, 1).astype(F32) * F32(0.03))


@pytest.mark.parametrize("layer, inputs, words", [
    ("QuantizedPermute odd 1 1 x y 4 0 2 3 1", "x 4 1 3 5 5", "3 input channels"),
    ("QuantizedPermute odd 1 1 x y 4 0 2 3 1", "x 4 1 8 6 4", "6 output channels"),
    ("QuantizedReshape odd 1 1 x y 0 -1 4 1 15 5 1 0", "x 4 1 3 5 5", "3 input channels"),
    ("QuantizedReshape odd 1 1 x y 0 -1 4 1 2 16 2 0", "x 4 1 8 4 2", "2 output channels"),
    ("QuantizedReshape odd 1 1 x y 0 -1 2 1 64 0", "x 4 1 8 4 2", "2-D output"),
    ("QuantizedSigmoid odd 1 1 x y", "x 4 1 8 4 4", "as float32"),
    ("QuantizedSigmoid odd 1 1 x y", "x 4 1 3 5 5", "x86_unary2_layer_acc.cc"),
])
def test_int8_layout_tnn_x86_leaves_undefined_is_refused_with_file_and_line(tmp_path, layer, inputs, words):
    c = int(inputs.split()[3])
    with pytest.raises(UnsupportedOpError) as e:
        quantized_model(tmp_path, [layer], [], {"x": np.full(c, 0.02, F32), "y": F32([0.02])}, inputs=inputs)
    assert layer.split()[0] in str(e.value) and "odd" in str(e.value) and "q.tnnproto:6" in str(e.value)
    assert words in str(e.value)


@pytest.mark.parametrize("layer, scales, words", [
    ("QuantizedReshape odd 1 1 x1 y 0 -1 4 1 15 5 1 1", {}, "reshape_type 1"),
    ("QuantizedReshapeTensorflow odd 1 1 x1 y 0 -1 4 1 15 5 1 1", {}, "reshape_type 1"),
    ("QuantizedSigmoid odd 1 1 x1 y", {"y": F32([0.01])}, "as float32"),
    ("QuantizedSigmoid odd 1 1 x1 y", {"y": F32([0.01, 0, 0.01])}, "as float32"),
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
    assert "QuantizedSigmoid" in str(e.value) and "q.tnnproto:7" in str(e.value) and "float32" in str(e.value)
