"""Recurrent layers: `RNN`, torch's nn.LSTM / nn.GRU / nn.RNN in one op (TNN's LSTMONNX
lowers to it as well).

Inputs: x, [h0], [c0 (LSTM)]; outputs: out, [h_n], [c_n (LSTM)]. x is (T, B, I), or (B, T, I) with batch_first;
out is (T, B, D·Hout) (or batch first), directions side by side; h_n is (L·D, B, Hout) and c_n (L·D, B, H), layer
l direction d at row l·D + d (torch's layout). Hout is proj_size when set (LSTM only), else hidden_size.
Params: mode `LSTM`/`GRU`/`RNN_TANH`/`RNN_RELU`, hidden_size, num_layers, bidirectional, batch_first, proj_size.
Attrs: torch's names, per layer and direction (`_reverse` suffix for the second): weight_ih_l{k} (G·H, in),
weight_hh_l{k} (G·H, Hout), bias_ih_l{k} and bias_hh_l{k} (G·H; zeros when the module has no bias), and
weight_hr_l{k} (Hout, H) with a projection. G = 4 (gates i, f, g, o), 3 (r, z, n) or 1.

The equations are torch's documented ones (GRU applies the reset gate to W_hn h + b_hn, not to h).
"""

from __future__ import annotations

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register

MODES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def gates(mode: str) -> int:
    return MODES[mode]


def hidden_out(node: Node) -> int:
    """Hout: the size of h (proj_size when the LSTM projects)."""
    return int(node.params.get("proj_size") or 0) or int(node.params["hidden_size"])


def directions(node: Node) -> int:
    return 2 if node.params.get("bidirectional") else 1


def suffix(layer: int, direction: int) -> str:
    return f"_l{layer}" + ("_reverse" if direction else "")


def sigmoid(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-v))


def cell(mode: str, xg: np.ndarray, h: np.ndarray, c: np.ndarray | None, w_hh: np.ndarray, b_hh: np.ndarray,
         w_hr: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """One time step: `xg` = W_ih x + b_ih (B, G·H) already computed, h (B, Hout), c (B, H) -> new (h, c)."""
    hg = h @ w_hh.T + b_hh
    hid = w_hh.shape[0] // gates(mode)
    if mode == "LSTM":
        s = xg + hg
        i, f, g, o = (s[:, k * hid:(k + 1) * hid] for k in range(4))
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        return (h if w_hr is None else h @ w_hr.T), c
    if mode == "GRU":
        r = sigmoid(xg[:, :hid] + hg[:, :hid])
        z = sigmoid(xg[:, hid:2 * hid] + hg[:, hid:2 * hid])
        n = np.tanh(xg[:, 2 * hid:] + r * hg[:, 2 * hid:])
        return (1.0 - z) * n + z * h, None
    s = xg + hg
    return (np.tanh(s) if mode == "RNN_TANH" else np.maximum(s, 0.0)), None


def run_direction(mode: str, x: np.ndarray, w_ih: np.ndarray, b_ih: np.ndarray, w_hh: np.ndarray,
                  b_hh: np.ndarray, h: np.ndarray, c: np.ndarray | None, reverse: bool,
                  w_hr: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """One layer in one direction over x (T, B, in): -> y (T, B, Hout), last h, last c."""
    xg = x @ w_ih.T + b_ih
    y = np.empty((x.shape[0], x.shape[1], h.shape[-1]), np.result_type(x, h))
    for step in range(x.shape[0]):
        t = x.shape[0] - 1 - step if reverse else step
        h, c = cell(mode, xg[t], h, c, w_hh, b_hh, w_hr)
        y[t] = h
    return y, h, c


def _check(node: Node, ins: list[TensorInfo]) -> tuple[int, int, int]:
    """-> (T, B, I) of x, after checking every input and weight against the params."""
    mode, x = node.params["mode"], ins[0]
    n_layers, d, hid, hout = int(node.params["num_layers"]), directions(node), int(node.params["hidden_size"]), \
        hidden_out(node)
    where = f"{node.where()}: {mode} node {node.name!r}"
    if len(ins) > (3 if mode == "LSTM" else 2) or (mode == "LSTM" and len(ins) == 2):
        raise ShapeError(f"{where} takes x{', h0, c0' if mode == 'LSTM' else ', h0'}; got {len(ins)} inputs")
    if len(x.shape) != 3:
        raise ShapeError(f"{where} takes a 3-D input, got {tuple(x.shape)}")
    t, b, i = (x.shape[1], x.shape[0], x.shape[2]) if node.params.get("batch_first") else tuple(x.shape)
    for k, want in ((1, (n_layers * d, b, hout)), (2, (n_layers * d, b, hid))):
        if k < len(ins) and (tuple(ins[k].shape) != want or np.dtype(ins[k].dtype) != np.dtype(x.dtype)):
            raise ShapeError(f"{where}: initial state {k} is {tuple(ins[k].shape)} {np.dtype(ins[k].dtype)}, "
                             f"expected {want} {np.dtype(x.dtype)}")
    g = gates(mode)
    for layer in range(n_layers):
        fan_in = i if layer == 0 else d * hout
        for dr in range(d):
            s = suffix(layer, dr)
            want = {"weight_ih": (g * hid, fan_in), "weight_hh": (g * hid, hout), "bias_ih": (g * hid,),
                    "bias_hh": (g * hid,)} | ({"weight_hr": (hout, hid)} if hout != hid else {})
            for name, shape in want.items():
                w = node.attrs.get(name + s)
                if w is None or tuple(w.shape) != shape:
                    got = None if w is None else tuple(w.shape)
                    raise ShapeError(f"{where}: weight {name + s} is {got}, expected {shape} for input {i}")
    return t, b, i


def infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    t, b, _ = _check(node, ins)
    d, hid, hout, dt = directions(node), int(node.params["hidden_size"]), hidden_out(node), np.dtype(ins[0].dtype)
    rows = int(node.params["num_layers"]) * d
    out = (b, t, d * hout) if node.params.get("batch_first") else (t, b, d * hout)
    outs = [TensorInfo(out, dt), TensorInfo((rows, b, hout), dt), TensorInfo((rows, b, hid), dt)]
    if len(node.outputs) > (3 if node.params["mode"] == "LSTM" else 2):
        raise ShapeError(f"{node.where()}: {node.params['mode']} node {node.name!r} has {len(node.outputs)} outputs")
    return outs[:len(node.outputs)]


def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    mode, dt = node.params["mode"], np.asarray(arrays[0]).dtype
    x = np.asarray(arrays[0], np.float64)
    if node.params.get("batch_first"):
        x = x.transpose(1, 0, 2)
    n_layers, d, hid, hout = int(node.params["num_layers"]), directions(node), int(node.params["hidden_size"]), \
        hidden_out(node)
    rows, b = n_layers * d, x.shape[1]
    h0 = np.asarray(arrays[1], np.float64) if len(arrays) > 1 else np.zeros((rows, b, hout))
    c0 = np.asarray(arrays[2], np.float64) if len(arrays) > 2 else np.zeros((rows, b, hid))
    a = {k: np.asarray(v, np.float64) for k, v in node.attrs.items()}
    hs, cs = [], []
    for layer in range(n_layers):
        ys = []
        for dr in range(d):
            s, row = suffix(layer, dr), layer * d + dr
            y, h, c = run_direction(mode, x, a["weight_ih" + s], a["bias_ih" + s], a["weight_hh" + s],
                                    a["bias_hh" + s], h0[row], c0[row] if mode == "LSTM" else None, dr == 1,
                                    a.get("weight_hr" + s))
            ys.append(y), hs.append(h), cs.append(c)
        x = np.concatenate(ys, axis=-1)
    out = x.transpose(1, 0, 2) if node.params.get("batch_first") else x
    outs = [out, np.stack(hs)] + ([np.stack(cs)] if mode == "LSTM" else [])
    return [np.ascontiguousarray(o).astype(dt) for o in outs[:len(node.outputs)]]


register(OpDef("RNN", infer, reference, arity=(1, 3), float_inputs=(0, 1, 2)))
