"""TNN layers no canonical op expresses.

`TnnLSTM` is TNN's LSTMONNX: ONNX LSTM weights (gates in i, o, f, c order; W [dirs, 4H, I], R [dirs, 4H, H],
B [dirs, 8H] = input and recurrence biases), but TNN's layouts: X is [T, batch, I] and Y is
[T, batch, dirs * H] (directions side by side, as torch gives it); Y_h and Y_c are [dirs, batch, H].
Inputs: X, W, R, B, [h0, c0]; params: hidden_size, direction (0 forward, 1 reverse, 2 both). The time loop and
the cell are recurrent.py's (the `RNN` op's), on the gates reordered to torch's.
"""

from __future__ import annotations

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.recurrent import run_direction
from engine.ops.registry import OpDef, TensorInfo, register

F32 = np.dtype(np.float32)


def _dirs(node: Node) -> int:
    return 2 if int(node.params.get("direction", 0)) == 2 else 1


def lstm_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    x, w = ins[0].shape, ins[1].shape
    h, d = int(node.params["hidden_size"]), _dirs(node)
    if len(x) < 3 or len(w) != 3 or w[0] != d or w[1] != 4 * h or w[2] != int(np.prod(x[2:])):
        raise ShapeError(f"{node.where()}: LSTM input {tuple(x)} does not fit weights {tuple(w)} "
                         f"(hidden {h}, {d} direction(s))")
    t, b = x[0], x[1]
    outs = [TensorInfo((t, b, d * h), F32), TensorInfo((d, b, h), F32), TensorInfo((d, b, h), F32)]
    return outs[:len(node.outputs)]


def _torch_gates(m: np.ndarray, hid: int) -> np.ndarray:
    """ONNX's gate blocks (i, o, f, c) in torch's order (i, f, g, o), the order recurrent.cell takes."""
    return np.concatenate([m[k * hid:(k + 1) * hid] for k in (0, 2, 3, 1)])


def _run_direction(x, w, r, b, h, c, reverse: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    hid = h.shape[-1]
    return run_direction("LSTM", x, _torch_gates(w, hid), _torch_gates(b[:4 * hid], hid), _torch_gates(r, hid),
                         _torch_gates(b[4 * hid:], hid), h, c, reverse)


def lstm_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x, w, r, b = (np.asarray(a, np.float64) for a in arrays[:4])
    x = x.reshape(x.shape[0], x.shape[1], -1)
    d, hid = _dirs(node), int(node.params["hidden_size"])
    batch = x.shape[1]
    h0 = np.asarray(arrays[4], np.float64).reshape(d, batch, hid) if len(arrays) > 4 else np.zeros((d, batch, hid))
    c0 = np.asarray(arrays[5], np.float64).reshape(d, batch, hid) if len(arrays) > 5 else np.zeros((d, batch, hid))
    reverse_only = int(node.params.get("direction", 0)) == 1
    ys, hs, cs = [], [], []
    for k in range(d):
        y, h, c = _run_direction(x, w[k], r[k], b[k], h0[k], c0[k], reverse=reverse_only or k == 1)
        ys.append(y), hs.append(h), cs.append(c)
    outs = [np.concatenate(ys, axis=-1), np.stack(hs), np.stack(cs)]
    return [o.astype(F32) for o in outs[:len(node.outputs)]]


register(OpDef("TnnLSTM", lstm_infer, lstm_reference))
