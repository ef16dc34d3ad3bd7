"""In-place activation epilogues shared by fused ops (Conv, ConvTranspose, Gemm) and the activation family."""

from __future__ import annotations

import math

import numpy as np


def _clip(out, p):
    lo, hi = p.get("min"), p.get("max")
    np.clip(out, -np.inf if lo is None else lo, np.inf if hi is None else hi, out=out)


def _leaky(out, p):
    alpha = p.get("alpha", 0.01)
    np.multiply(out, np.where(out < 0, out.dtype.type(alpha), out.dtype.type(1)), out=out)


def _sigmoid(out, p):
    np.negative(out, out=out)
    np.exp(out, out=out)
    out += 1
    np.reciprocal(out, out=out)


def _silu(out, p):
    s = out.copy()
    _sigmoid(s, p)
    out *= s


def _hardsigmoid(out, p):
    out *= p.get("alpha", 1 / 6)
    out += p.get("beta", 0.5)
    np.clip(out, 0, 1, out=out)


def _hardswish(out, p):
    s = out.copy()
    _hardsigmoid(s, p)
    out *= s


def _gelu(out, p):
    x = out.astype(np.float64)
    if p.get("approximate", "none") == "tanh":
        y = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    else:
        from math import erf

        y = 0.5 * x * (1 + np.vectorize(erf, otypes=[np.float64])(x / math.sqrt(2)))
    out[...] = y


def _elu(out, p):
    alpha = p.get("alpha", 1.0)
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
