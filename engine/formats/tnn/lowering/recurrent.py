"""TNN's LSTMONNX -> the canonical `RNN` op (engine/ops/recurrent.py, the one pnnx's nn.LSTM lowers to).

LSTMONNX (TNN's layer and X86LSTMONNXLayerAcc, written by onnx2tnn from ONNX LSTM) has params clip_threshold,
hidden_size, direction (0 forward, 1 reverse, 2 bidirectional) and inputs X [T, B, ...] (the dims after the batch
are the features), W [dirs, 4H, I], R [dirs, 4H, H], B [dirs, 8H] (input then recurrence biases), [h0, c0]
[dirs, B, H], gates in ONNX's i, o, f, c order; outputs Y [T, B, dirs·H] (directions side by side), Y_h, Y_c
[dirs, B, H]. The acc packs W, R and B at Init, so they are the model's constants here too; they become the RNN
op's weights in torch's gate order (i, f, g, o), and the two biases its bias_ih / bias_hh (the acc sums them).

What the acc does not do is refused: a clip threshold (it ignores it), peephole weights (a 7th input, ignored),
sequence lengths (onnx2tnn refuses ONNX's sequence_lens), and 5 inputs (the acc ignores a lone h0, and onnx2tnn
drops empty ONNX inputs, so a 5th input may be h0 or, with B absent, something else). The acc always writes Y,
Y_h and Y_c, so a layer with other than 3 outputs is refused as well. A reverse-only LSTM runs the RNN op
forward over X reversed in time and reverses Y back: the acc's y[t] is the state after reading x[t] backwards.
"""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import Ctx, f32
from engine.formats.tnn.lowering.registry import handles
from engine.ir import Value

DIRECTIONS = {0: "forward", 1: "reverse", 2: "bidirectional"}
ONNX_TO_TORCH = (0, 2, 3, 1)  # gate blocks i, o, f, c -> i, f, c(g), o
_INT_MIN = -(2 ** 63) + 1


def _torch_gates(m: np.ndarray, hid: int) -> np.ndarray:
    return f32(np.concatenate([m[k * hid:(k + 1) * hid] for k in ONNX_TO_TORCH]))


def _weight(c: Ctx, k: int, name: str, want: tuple[int, ...]) -> np.ndarray:
    data = c.value_of(c.inputs[k])
    if data is None or not c.inputs[k].is_const:
        c.unsupported(f"with a computed {name} (input {k}: TNN's acc packs the weights once, from constants)")
    if tuple(data.shape) != want:
        c.fail(f"{name} (input {k}) is {tuple(data.shape)}, expected {want}")
    if np.dtype(data.dtype).kind != "f":
        c.fail(f"{name} (input {k}) is {np.dtype(data.dtype)}, expected float")
    return np.asarray(data, np.float64)


def _reverse_time(c: Ctx, v: Value) -> Value:
    return c.tmp("Slice", [v], {"starts": [-1], "ends": [_INT_MIN], "axes": [0], "steps": [-1]})


def _state(c: Ctx, k: int, want: tuple[int, int, int]) -> Value:
    """h0 / c0 as the RNN op takes them: (dirs, B, H); TNN copies the blob's data whatever its dims say."""
    v, shape = c.inputs[k], c.shape(c.inputs[k])
    if shape is None or tuple(shape) == want:
        return v
    if int(np.prod(shape)) != int(np.prod(want)):
        c.fail(f"initial state (input {k}) is {tuple(shape)}, expected {want}")
    return c.tmp("Reshape", [v], {"shape": list(want)})


@handles("LSTMONNX")
def lower_lstm(c: Ctx) -> None:
    clip, hid, direction = c.f(0, 0.0), c.i(1, 0), c.i(2, 0)
    n_in, n_out = len(c.inputs), len(c.outputs)
    if direction not in DIRECTIONS:
        c.unsupported(f"with direction {direction} (TNN knows 0 forward, 1 reverse, 2 bidirectional)")
    if clip:
        c.unsupported(f"with clip threshold {clip} (TNN's acc ignores it; ONNX clips the gates)")
    if hid <= 0:
        c.fail(f"hidden_size is {hid}")
    if n_in == 7:
        c.unsupported("with peephole weights (a 7th input: TNN's acc ignores them)")
    if n_in == 5:
        c.unsupported("with 5 inputs (TNN's acc ignores a lone initial h; takes X, W, R, B and both h0 and c0)")
    if not (n_in == 4 or n_in == 6):
        c.fail(f"has {n_in} inputs (takes X, W, R, B and optionally h0, c0)")
    if n_out != 3:
        c.unsupported(f"with {n_out} outputs (TNN's acc writes Y, Y_h and Y_c)")
    x = c.inputs[0]
    shape = c.shape(x)
    if shape is None or len(shape) < 3:
        c.fail(f"input X is {shape}, expected [T, batch, features...]")
    d, feat = 2 if direction == 2 else 1, int(np.prod(shape[2:]))
    w = _weight(c, 1, "W", (d, 4 * hid, feat))
    r = _weight(c, 2, "R", (d, 4 * hid, hid))
    b = _weight(c, 3, "B", (d, 8 * hid))
    attrs = {}
    for k in range(d):
        s = "_l0" + ("_reverse" if k else "")
        attrs |= {"weight_ih" + s: _torch_gates(w[k], hid), "weight_hh" + s: _torch_gates(r[k], hid),
                  "bias_ih" + s: _torch_gates(b[k][:4 * hid], hid), "bias_hh" + s: _torch_gates(b[k][4 * hid:], hid)}
    if len(shape) > 3:
        x = c.tmp("Reshape", [x], {"shape": [0, 0, -1]})
    states = [_state(c, k, (d, shape[1], hid)) for k in range(4, n_in)]
    params = {"mode": "LSTM", "hidden_size": hid, "num_layers": 1, "bidirectional": d == 2, "batch_first": False,
              "proj_size": 0}
    if direction != 1:
        c.emit("RNN", [x, *states], params, attrs, outputs=list(c.outputs))
        return
    y_rev = c.graph.value(f"{c.node.name}/y_reversed")
    c.emit("RNN", [_reverse_time(c, x), *states], params, attrs, outputs=[y_rev, *c.outputs[1:]])
    c.emit("Slice", [y_rev], {"starts": [-1], "ends": [_INT_MIN], "axes": [0], "steps": [-1]},
           outputs=[c.outputs[0]])
