"""In-place activation epilogues shared by fused ops (Conv, ConvTranspose, Gemm) and the activation family.

On C-contiguous float32/float64 outputs the transcendental ones run the activation family's numba loops (one
pass, no temporaries); anything else takes the numpy path below.
"""

from __future__ import annotations

import math

import numpy as np

from engine.devices.cpu.loops import pointwise as mk


def _get(p: dict, name: str, default: float) -> float:
    v = p.get(name)
    return default if v is None else float(v)


def _flat(out: np.ndarray) -> np.ndarray | None:
    """A 1-d view of `out` when a numba loop can run on it in place, else None."""
    if out.dtype in (np.float32, np.float64) and out.flags.c_contiguous:
        return out.reshape(-1)
    return None


def _clip(out, p):
    lo, hi = p.get("min"), p.get("max")
    np.clip(out, -np.inf if lo is None else lo, np.inf if hi is None else hi, out=out)


def _leaky(out, p):
    alpha = _get(p, "alpha", 0.01)
    if (f := _flat(out)) is not None:
        mk.leaky_relu_loop(f, f, alpha)
        return
    np.multiply(out, np.where(out < 0, out.dtype.type(alpha), out.dtype.type(1)), out=out)


def _sigmoid(out, p):
    if (f := _flat(out)) is not None:
        mk.sigmoid_loop(f, f)
        return
    np.negative(out, out=out)
    np.exp(out, out=out)
    out += 1
    np.reciprocal(out, out=out)


def _silu(out, p):
    if (f := _flat(out)) is not None:
        mk.silu_loop(f, f)
        return
    s = out.copy()
    _sigmoid(s, p)
    out *= s


def _hardsigmoid(out, p):
    alpha, beta = _get(p, "alpha", 1 / 6), _get(p, "beta", 0.5)
    out *= alpha
    out += beta
    np.clip(out, 0, 1, out=out)


def _hardswish(out, p):
    alpha, beta = _get(p, "alpha", 1 / 6), _get(p, "beta", 0.5)
    if (f := _flat(out)) is not None:
        mk.hardswish_loop(f, f, alpha, beta)
        return
    s = out.copy()
    _hardsigmoid(s, p)
    out *= s


def _gelu(out, p):
    tanh = p.get("approximate", "none") == "tanh"
    if (f := _flat(out)) is not None:
        (mk.gelu_tanh_loop if tanh else mk.gelu_loop)(f, f)
        return
    x = out.astype(np.float64)
    if tanh:
        y = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    else:
        y = 0.5 * x * (1 + np.vectorize(math.erf, otypes=[np.float64])(x / math.sqrt(2)))
    out[...] = y


def _elu(out, p):
    alpha = _get(p, "alpha", 1.0)
    if (f := _flat(out)) is not None:
        mk.elu_loop(f, f, alpha)
        return
    neg = out < 0
    out[neg] = alpha * np.expm1(out[neg])


EPILOGUES = {
    "relu": lambda out, p: np.maximum(out, 0, out=out),
    "relu6": lambda out, p: np.clip(out, 0, 6, out=out),
    "clip": _clip,
    "leaky_relu": _leaky,
    "sigmoid": _sigmoid,
    "silu": _silu,
    "hardsigmoid": _hardsigmoid,
    "hardswish": _hardswish,
    "gelu": _gelu,
    "tanh": lambda out, p: np.tanh(out, out=out),
    "elu": _elu,
}


def apply_activation(name: str | None, params: dict | None, out: np.ndarray) -> None:
    """Applies activation `name` to `out` in place (no-op for None)."""
    if name is None:
        return
    EPILOGUES[name](out, params or {})
