"""The pieces of `nnserve quantize` against TNN's quantization tool's formulas (tools/quantization/calibration.cc,
scale_calculator.cc), written out here element by element, and the int8 file it writes."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

import engine
from engine.errors import EngineError
from engine.quantize import QuantizeOptions, quantize
from engine.quantize.images import read_image, resize_bilinear
from engine.quantize.scales import BINS, kl_threshold, minmax_scales, percentile_scales
from engine.quantize.weights import quantize_conv, quantize_inner_product

RNG = np.random.default_rng(5)
F32 = np.float32


def _std_round(v: float) -> int:
    return int(math.floor(v + 0.5)) if v >= 0 else -int(math.floor(-v + 0.5))


def test_conv_weights_fold_the_input_scale_then_minmax_per_channel():
    w = RNG.standard_normal((4, 3, 2, 2)).astype(F32)
    bias = RNG.standard_normal(4).astype(F32)
    s_in = F32([0.02, 0.5, 0.1])
    q, b, scale = quantize_conv(w, bias, s_in, groups=1)
    for o in range(4):
        w_eff = [F32(w[o, i, y, x]) * s_in[i] for i in range(3) for y in range(2) for x in range(2)]
        s = F32(max(abs(v) for v in w_eff)) / F32(127.0)
        assert scale[o] == s
        want = [max(-127, min(127, _std_round(float(F32(v) * (F32(1.0) / s))))) for v in w_eff]
        assert q[o].ravel().tolist() == want
        assert b[o] == int(F32(bias[o]) / s)  # C++'s cast truncates


def test_depthwise_weights_keep_their_scale_times_the_input_scale():
    w = RNG.standard_normal((3, 1, 3, 3)).astype(F32)
    s_in = F32([0.02, 0.5, 0.1])
    q, _, scale = quantize_conv(w, None, s_in, groups=3)
    for o in range(3):
        s = F32(np.abs(w[o]).max()) / F32(127.0)
        assert scale[o] == F32(s * s_in[o])
        assert np.array_equal(q[o].ravel(), [_std_round(float(F32(v) * (F32(1) / s))) for v in w[o].ravel()])


def test_inner_product_takes_one_input_scale():
    w = RNG.standard_normal((5, 7)).astype(F32)
    q, b, scale = quantize_inner_product(w, np.zeros(5, F32), F32([0.3]))
    assert np.allclose(q * scale[:, None], w * F32(0.3), atol=float(scale.max()))
    with pytest.raises(ValueError, match="one scale"):
        quantize_inner_product(w, None, F32([0.3, 0.2]))


def test_minmax_scale_is_tnns_threshold_formula():
    # TNN: interval = 2048 / max (float); scale = (2047 + 0.5) / interval / 127 (double)
    m = F32([3.0, 1e-6, 0.25])
    want = [(2047 + 0.5) / float(F32(2048) / F32(v)) / 127.0 for v in (3.0, 0.25)]
    got = minmax_scales(m)
    assert got[0] == F32(want[0]) and got[2] == F32(want[1]) and got[1] == 0  # below 1e-5: invalid, 0


def test_kl_clips_a_long_thin_tail_and_keeps_a_flat_histogram():
    flat = np.ones(BINS, F32)
    assert kl_threshold(flat) >= BINS - 64
    tail = np.zeros(BINS, F32)
    tail[:200] = 1000.0
    tail[2000] = 1.0  # one outlier far out
    assert kl_threshold(tail) < 400


def test_percentile_picks_the_bin_holding_that_share():
    hist = np.zeros((1, BINS))
    hist[0, :100] = 1.0
    hist[0, 1000] = 0.01
    s = percentile_scales(hist, F32([2.0]), 99.0)
    t = np.argmax(np.cumsum(hist[0]) / hist[0].sum() >= 0.99)
    assert s[0] == F32((t + 0.5) / float(F32(BINS) / F32(2.0)) / 127.0)


def test_png_reader_and_resize(repo_root):
    img = read_image(repo_root / "examples" / "photos" / "astronaut.png")
    assert img.shape == (192, 256, 3) and img.dtype == np.uint8
    digest = hashlib.sha256(img.tobytes()).hexdigest()  # the photo's README gives its decoded pixels' hash
    assert digest == "17aafb1aea244905ad6cfa5ba69c18cc726c9cd663772e7b35f0d11f7c1fa122"
    small = resize_bilinear(img, (96, 128))
    assert small.shape == (96, 128, 3)
    assert np.allclose(small, img.reshape(96, 2, 128, 2, 3).mean(axis=(1, 3)), atol=0.51)  # 2x: mean of 4


@pytest.fixture(scope="module")
def small_int8(tmp_path_factory, load_fixture):
    fx = load_fixture("mobilenet_v2")
    samples = [{"in0": RNG.standard_normal((1, 3, 64, 64)).astype(F32)} for _ in range(4)]
    out = tmp_path_factory.mktemp("q") / "small"
    return quantize(fx.param, samples, out, QuantizeOptions(report_samples=2)), fx


def test_the_file_is_written_as_tnns_tool_writes_it(small_int8):
    result, _ = small_int8
    text = result.proto.read_text()
    layers = [line.strip('"').split()[0] for line in text.splitlines()[5:]]
    assert {"QuantizedConvolution", "QuantizedAdd", "QuantizedInnerProduct"} <= set(layers)
    assert "Quantize" not in layers and "Dequantize" not in layers  # TNN inserts its reformats itself
    data = result.model.read_bytes()
    assert b"_scale_data_" in data and b"QuantizedConvolution" not in data  # resources say "Convolution"
    # every int8 blob a quantized layer reads or writes has its BlobScale resource
    for line in text.splitlines()[5:]:
        tokens = line.strip('"').split()
        if tokens[0].startswith("Quantized"):
            n_in, n_out = int(tokens[2]), int(tokens[3])
            for blob in tokens[4:4 + n_in + n_out]:
                assert f"{blob}_scale_data_".encode() in data, blob


def test_the_report_covers_every_int8_layer(small_int8):
    result, _ = small_int8
    loaded = engine.load(result.proto).op_counts()  # 1x1 convs and the adds after them are one layer there
    assert len(result.layers) == sum(n for op, n in loaded.items() if op.startswith("TnnQ") and op != "TnnQuantize")
    assert {e.op for e in result.layers} == {"TnnQConv", "TnnQAdd", "TnnQInnerProduct"}
    assert all(-1.0 <= e.cosine <= 1.0 + 1e-9 and e.max_abs >= 0 for e in result.layers)


def test_refusals(tmp_path, small_int8):
    result, fx = small_int8
    with pytest.raises(EngineError, match="quantized already"):
        quantize(result.proto, [fx.inputs], tmp_path / "again")
    with pytest.raises(EngineError, match="no calibration inputs"):
        quantize(fx.param, [], tmp_path / "none")
    with pytest.raises(EngineError, match="the model takes"):
        quantize(fx.param, [{"x": fx.inputs["in0"]}], tmp_path / "wrong")
    with pytest.raises(EngineError, match="unknown calibration method"):
        quantize(fx.param, [fx.inputs], tmp_path / "m", QuantizeOptions(method="mse"))
    for bad in (np.nan, np.inf):  # one such pixel made every bias INT32_MIN, silently
        x = RNG.standard_normal((1, 3, 64, 64)).astype(F32)
        x[0, 1, 2, 3] = bad
        with pytest.raises(EngineError, match="calibration input 1's 'in0' holds a NaN or an infinity"):
            quantize(fx.param, [fx.inputs, {"in0": x}], tmp_path / "nan")
        assert not (tmp_path / "nan.tnnproto").exists()
    assert engine.load(result.proto).op_counts()["TnnQConv"] > 0
