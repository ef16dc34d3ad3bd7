"""TNN's LSTMONNX (lowered to the RNN op) against ONNX's LSTM equations written out here in ONNX's own gate order
(i, o, f, c), every variant TNN's x86 acc runs; and the load-time refusals of what it does not."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ModelFormatError, UnsupportedOpError
from tests.engine.formats.tnn.test_tnn_lowering import tnn_model

RNG = np.random.default_rng(5)
T, B, I, H = 5, 2, 6, 3


def _sig(v):
    return 1.0 / (1.0 + np.exp(-v))


def onnx_lstm(x, w, r, b, h0, c0, direction):
    """ONNX LSTM: it = σ(Xt·Wiᵀ + Ht-1·Riᵀ + Wbi + Rbi), ... Ct = ft⊙Ct-1 + it⊙ct, Ht = ot⊙tanh(Ct), in float64."""
    x = x.reshape(x.shape[0], x.shape[1], -1).astype(np.float64)
    dirs = 2 if direction == 2 else 1
    ys, hs, cs = [], [], []
    for d in range(dirs):
        h, c = h0[d].astype(np.float64), c0[d].astype(np.float64)
        y = np.zeros((x.shape[0], x.shape[1], H))
        steps = range(x.shape[0] - 1, -1, -1) if direction == 1 or d == 1 else range(x.shape[0])
        for t in steps:
            g = x[t] @ w[d].T + h @ r[d].T + b[d][:4 * H] + b[d][4 * H:]
            i, o, f, cc = (g[:, k * H:(k + 1) * H] for k in range(4))
            c = _sig(f) * c + _sig(i) * np.tanh(cc)
            h = _sig(o) * np.tanh(c)
            y[t] = h
        ys.append(y), hs.append(h), cs.append(c)
    return np.concatenate(ys, -1), np.stack(hs), np.stack(cs)


def _weights(direction):
    d = 2 if direction == 2 else 1
    return (RNG.standard_normal((d, 4 * H, I)).astype(np.float32) * 0.5,
            RNG.standard_normal((d, 4 * H, H)).astype(np.float32) * 0.5,
            RNG.standard_normal((d, 8 * H)).astype(np.float32) * 0.5)


@pytest.mark.parametrize("direction", [0, 1, 2])
@pytest.mark.parametrize("states", ["none", "const", "inputs"])
def test_lstm_variants_match_onnx_equations(tmp_path, direction, states):
    d = 2 if direction == 2 else 1
    w, r, b = _weights(direction)
    x = RNG.standard_normal((T, B, I)).astype(np.float32)
    h0, c0 = (RNG.standard_normal((d, B, H)).astype(np.float32) for _ in range(2))
    consts = [("w", w), ("r", r), ("b", b)]
    inputs = f"x 3 {T} {B} {I} 0"
    ins = "x w r b"
    if states == "const":
        consts += [("h0", h0), ("c0", c0)]
        ins += " h0 c0"
    elif states == "inputs":
        inputs += f" : h0 3 {d} {B} {H} 0 : c0 3 {d} {B} {H} 0"
        ins += " h0 c0"
    n_in = len(ins.split())
    layer = f"LSTMONNX l {n_in} 3 {ins} y yh yc 0 {H} {direction}"
    model = tnn_model(tmp_path, inputs, [layer], "y yh yc", consts=consts)
    feed = {"x": x} | ({"h0": h0, "c0": c0} if states == "inputs" else {})
    out = model.instance().run(feed)
    zeros = np.zeros((d, B, H), np.float32)
    ref = onnx_lstm(x, w, r, b, *((h0, c0) if states != "none" else (zeros, zeros)), direction)
    for name, want in zip(("y", "yh", "yc"), ref, strict=True):
        np.testing.assert_allclose(out[name], want, rtol=1e-5, atol=1e-5)


def test_lstm_runs_on_the_rnn_kernel_not_a_reference(tmp_path):
    w, r, b = _weights(2)
    model = tnn_model(tmp_path, f"x 3 {T} {B} {I} 0", [f"LSTMONNX l 4 3 x w r b y yh yc 0 {H} 2"], "y yh yc",
                      consts=[("w", w), ("r", r), ("b", b)])
    assert model.graph.op_counts().get("RNN") == 1 and "TnnLSTM" not in model.graph.op_counts()


def test_lstm_flattens_features_after_the_batch(tmp_path):
    """TNN's input_size is the count of X's dims after the batch: a [T, B, 2, 3] X is [T, B, 6]."""
    w, r, b = _weights(0)
    x = RNG.standard_normal((T, B, 2, 3)).astype(np.float32)
    model = tnn_model(tmp_path, f"x 4 {T} {B} 2 3 0", [f"LSTMONNX l 4 3 x w r b y yh yc 0 {H} 0"], "y yh yc",
                      consts=[("w", w), ("r", r), ("b", b)])
    out = model.instance().run({"x": x})
    zeros = np.zeros((1, B, H), np.float32)
    np.testing.assert_allclose(out["y"], onnx_lstm(x, w, r, b, zeros, zeros, 0)[0], rtol=1e-5, atol=1e-5)


def test_lstm_runs_a_shorter_sequence_than_its_max_shape(tmp_path):
    w, r, b = _weights(1)
    model = tnn_model(tmp_path, f"x 3 {T} {B} {I} 0", [f"LSTMONNX l 4 3 x w r b y yh yc 0 {H} 1"], "y yh yc",
                      consts=[("w", w), ("r", r), ("b", b)])
    x = RNG.standard_normal((T, B, I)).astype(np.float32)
    out = model.instance().run({"x": x})
    zeros = np.zeros((1, B, H), np.float32)
    for name, want in zip(("y", "yh", "yc"), onnx_lstm(x, w, r, b, zeros, zeros, 1), strict=True):
        np.testing.assert_allclose(out[name], want, rtol=1e-5, atol=1e-5)


def _refused(tmp_path, layer, consts=None, inputs=f"x 3 {T} {B} {I} 0", outputs="y yh yc"):
    w, r, b = _weights(0)
    h0 = np.zeros((1, B, H), np.float32)
    consts = consts or [("w", w), ("r", r), ("b", b), ("h0", h0), ("c0", h0), ("p", np.zeros((1, 3 * H), 'f'))]
    return tnn_model(tmp_path, inputs, ["ReLU relu 1 1 x x1", layer], outputs, consts=consts)


@pytest.mark.parametrize("layer, words", [
    (f"LSTMONNX odd 4 3 x1 w r b y yh yc 0.5 {H} 0", "clip threshold"),
    (f"LSTMONNX odd 4 3 x1 w r b y yh yc 0 {H} 3", "direction 3"),
    (f"LSTMONNX odd 5 3 x1 w r b h0 y yh yc 0 {H} 0", "5 inputs"),
    (f"LSTMONNX odd 7 3 x1 w r b h0 c0 p y yh yc 0 {H} 0", "peephole"),
    (f"LSTMONNX odd 4 1 x1 w r b y 0 {H} 0", "1 outputs"),
    (f"LSTMONNX odd 4 3 x1 w x1 b y yh yc 0 {H} 0", "computed R"),
])
def test_lstm_variants_tnn_does_not_run_are_refused_with_file_and_line(tmp_path, layer, words):
    outputs = "y" if " 1 x1" in layer else "y yh yc"
    with pytest.raises(UnsupportedOpError) as e:
        _refused(tmp_path, layer, outputs=outputs)
    assert "LSTMONNX" in str(e.value) and "odd" in str(e.value) and "m.tnnproto:7" in str(e.value)
    assert words in str(e.value)


@pytest.mark.parametrize("layer, words", [
    (f"LSTMONNX odd 4 3 x1 w r b y yh yc 0 {H + 1} 0", "W (input 1)"),
    (f"LSTMONNX odd 3 3 x1 w r y yh yc 0 {H} 0", "3 inputs"),
    ("LSTMONNX odd 4 3 x1 w r b y yh yc 0 0 0", "hidden_size"),
])
def test_lstm_inconsistent_layers_are_format_errors_with_line(tmp_path, layer, words):
    with pytest.raises(ModelFormatError) as e:
        _refused(tmp_path, layer)
    assert e.value.line == 7 and words in str(e.value) and "odd" in str(e.value)
