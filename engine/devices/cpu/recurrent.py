"""CPU kernel of `RNN` (engine/ops/recurrent.py: torch's LSTM, GRU and RNN), float32.

Per layer and direction: the input projection of every time step is one GEMM up front (x (T·B, in) @ W_ihᵀ), then
the time loop does the hidden projection (h (B, Hout) @ W_hhᵀ) and the gate arithmetic in place with numpy ufuncs.
Weights are transposed and packed once at build; every buffer (the time-major input, two layer outputs in turn, the
projections, h and c) is carved from the instance workspace at the actual T and B, so a kernel built at the max
shape runs any smaller sequence length and batch without allocating. Other dtypes run the numpy reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.devices.cpu.kernel import Backends, CpuKernel, empty, packed, reference_fallback
from engine.devices.cpu.loops import fused_epilogue as E
from engine.devices.cpu.threads import parallel_for
from engine.ir import Node
from engine.ops.recurrent import directions, gates, hidden_out, reference, suffix
from engine.ops.registry import TensorInfo

_F32 = np.dtype(np.float32)


@dataclass(frozen=True)
class _Dims:
    mode: str
    layers: int
    dirs: int
    hid: int
    hout: int
    g: int
    batch_first: bool

    @classmethod
    def of(cls, node: Node) -> _Dims:
        return cls(node.params["mode"], int(node.params["num_layers"]), directions(node),
                   int(node.params["hidden_size"]), hidden_out(node), gates(node.params["mode"]),
                   bool(node.params.get("batch_first")))

    def tbi(self, shape: tuple[int, ...]) -> tuple[int, int, int]:
        return (shape[1], shape[0], shape[2]) if self.batch_first else (shape[0], shape[1], shape[2])

    def floats(self, t: int, b: int, i: int) -> list[int]:
        """Sizes of the workspace buffers: x time-major, two layer outputs, input gates, hidden gates, h, c, tmp."""
        g_h = self.g * self.hid
        return [t * b * i if self.batch_first else 0, t * b * self.dirs * self.hout, t * b * self.dirs * self.hout,
                t * b * g_h, b * g_h, b * self.hout, b * self.hid, b * self.hid]


def _workspace(backends: Backends, node: Node, ins: list[TensorInfo]) -> int:
    if np.dtype(ins[0].dtype) != _F32:
        return 0
    sizes = _Dims.of(node).floats(*_Dims.of(node).tbi(tuple(ins[0].shape)))
    return 4 * (sum(sizes) + 16 * len(sizes)) + 64


def _carve(workspace: np.ndarray | None, sizes: list[int]) -> list[np.ndarray]:
    """Flat float32 buffers of `sizes`, each 64-byte aligned, from the workspace (or fresh when run alone)."""
    need = 4 * (sum(sizes) + 16 * len(sizes)) + 64
    flat = workspace.reshape(-1).view(np.uint8) if workspace is not None else None
    if flat is None or flat.nbytes < need:
        flat = np.empty(need, np.uint8)
    start = (-flat.ctypes.data) % 64
    out = []
    for n in sizes:
        out.append(flat[start:start + 4 * n].view(_F32))
        start += 4 * (n + (-n) % 16)
    return out


def _sigmoid(v: np.ndarray) -> None:
    np.negative(v, out=v)
    np.exp(v, out=v)
    v += 1.0
    np.reciprocal(v, out=v)


@dataclass(frozen=True)
class _Weights:
    w_ih: np.ndarray  # (in, G·H)
    w_hh: np.ndarray  # (Hout, G·H)
    b_x: np.ndarray  # added to the input projection: b_ih (+ b_hh where the gate sums both)
    b_hn: np.ndarray | None  # GRU: b_hn stays inside the reset product
    w_hr: np.ndarray | None  # (H, Hout) projection


def _pack(node: Node, d: _Dims) -> list[_Weights]:
    packs = []
    for layer in range(d.layers):
        for dr in range(d.dirs):
            s = suffix(layer, dr)
            b_ih, b_hh = (np.asarray(node.attrs[n + s], np.float32) for n in ("bias_ih", "bias_hh"))
            if d.mode == "GRU":
                b_x = b_ih.copy()
                b_x[:2 * d.hid] += b_hh[:2 * d.hid]
                b_hn = packed(b_hh[2 * d.hid:])
            else:
                b_x, b_hn = b_ih + b_hh, None
            w_hr = node.attrs.get("weight_hr" + s)
            packs.append(_Weights(packed(np.asarray(node.attrs["weight_ih" + s]).T), packed(
                np.asarray(node.attrs["weight_hh" + s]).T), packed(b_x), b_hn,
                None if w_hr is None else packed(np.asarray(w_hr).T)))
    return packs


def _step(d: _Dims, w: _Weights, xg: np.ndarray, hg: np.ndarray, h: np.ndarray, c: np.ndarray,
          tmp: np.ndarray) -> None:
    """One time step in place: xg (B, G·H) the input gates of this step, h and c the state. The step's GEMMs have
    B rows: one BLAS call each (np.matmul), not blas.py's thread-pool split, whose hand-off costs more than the
    product at this size."""
    hid = d.hid
    np.matmul(h, w.w_hh, out=hg)
    if d.mode == "GRU":
        r, z, n = hg[:, :hid], hg[:, hid:2 * hid], hg[:, 2 * hid:]
        E.epilogue_cols(n, w.b_hn, True, E.ACT_NONE, 0.0, 0.0, 0.0, 0, n.shape[0])  # numpy would buffer
        r += xg[:, :hid]
        z += xg[:, hid:2 * hid]
        _sigmoid(r)
        _sigmoid(z)
        n *= r
        n += xg[:, 2 * hid:]
        np.tanh(n, out=n)
        h -= n  # h' = n + z (h - n)
        h *= z
        h += n
        return
    hg += xg
    if d.mode != "LSTM":
        if d.mode == "RNN_TANH":
            np.tanh(hg, out=h)
        else:
            np.maximum(hg, 0.0, out=h)
        return
    i, f, g, o = (hg[:, k * hid:(k + 1) * hid] for k in range(4))
    _sigmoid(i)
    _sigmoid(f)
    _sigmoid(o)
    np.tanh(g, out=g)
    c *= f
    i *= g
    c += i
    np.tanh(c, out=tmp)
    if w.w_hr is None:
        np.multiply(o, tmp, out=h)
    else:
        tmp *= o
        np.matmul(tmp, w.w_hr, out=h)


def _build(backends: Backends, node: Node, ins: list[TensorInfo]):
    if np.dtype(ins[0].dtype) != _F32:
        return reference_fallback(node, reference)
    d = _Dims.of(node)
    packs = _pack(node, d)
    matmul = backends.blas.matmul
    lstm = d.mode == "LSTM"
    g = d.g * d.hid
    # numba compiles the bias loop for both layouts it meets (whole rows, GRU's strided n gate) now, not on the
    # first request
    E.epilogue_cols(empty(2, _F32), packs[0].b_x, True, E.ACT_NONE, 0.0, 0.0, 0.0, 0, 0)
    E.epilogue_cols(np.zeros((1, 2 * g), _F32)[:, g:], packs[0].b_x, True, E.ACT_NONE, 0.0, 0.0, 0.0, 0, 0)

    def run(inputs, outputs, workspace):
        t, b, i = d.tbi(inputs[0].shape)
        xt, ya, yb, xg, hg, h, c, tmp = _carve(workspace, d.floats(t, b, i))
        x = inputs[0]
        if d.batch_first:
            x = xt.reshape(t, b, i)
            np.copyto(x, inputs[0].transpose(1, 0, 2))
        x = np.ascontiguousarray(x).reshape(t * b, i)
        hg, h, c, tmp = hg.reshape(b, -1), h.reshape(b, d.hout), c.reshape(b, d.hid), tmp.reshape(b, d.hid)
        xg = xg.reshape(t, b, d.g * d.hid)
        width = d.dirs * d.hout
        for layer in range(d.layers):
            y = (ya if layer % 2 == 0 else yb).reshape(t, b, width)
            for dr in range(d.dirs):
                row = layer * d.dirs + dr
                w = packs[row]
                gx = xg.reshape(t * b, -1)
                matmul(x, w.w_ih, gx)
                # Gemm's bias epilogue: numpy's broadcast add would allocate an iterator buffer
                parallel_for(E.epilogue_cols, t * b, gx.size, gx, w.b_x, True, E.ACT_NONE, 0.0, 0.0, 0.0)
                h[...] = inputs[1][row] if len(inputs) > 1 else 0.0
                if lstm:
                    c[...] = inputs[2][row] if len(inputs) > 2 else 0.0
                for step in range(t):
                    k = t - 1 - step if dr else step
                    _step(d, w, xg[k], hg, h, c, tmp)
                    y[k, :, dr * d.hout:(dr + 1) * d.hout] = h
                if len(outputs) > 1:
                    outputs[1][row] = h
                if len(outputs) > 2:
                    outputs[2][row] = c
            x = y.reshape(t * b, width)
        y = x.reshape(t, b, width)
        np.copyto(outputs[0], y.transpose(1, 0, 2) if d.batch_first else y)
    return run


KERNELS = {"RNN": CpuKernel(_build, _workspace)}
