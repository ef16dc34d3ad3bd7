"""The fused activation epilogue of Conv, ConvTranspose and Gemm (SPEC.md): the activation names those ops accept
and what each computes, applied in place to an output in numpy. The activation family's references agree with
these (tests/engine/devices/cpu/test_activation_kernels.py); devices run their own versions
(engine/devices/cpu/epilogue.py).
"""

from __future__ import annotations

import math

import numpy as np


def param(p: dict, name: str, default: float) -> float:
    v = p.get(name)
    return default if v is None else float(v)


def clip(out, p):
    lo, hi = p.get("min"), p.get("max")
    np.clip(out, -np.inf if lo is None else lo, np.inf if hi is None else hi, out=out)


def leaky_relu(out, p):
    alpha = param(p, "alpha", 0.01)
    np.multiply(out, np.where(out < 0, out.dtype.type(alpha), out.dtype.type(1)), out=out)


def sigmoid(out, p):
    np.negative(out, out=out)
    np.exp(out, out=out)
    out += 1
    np.reciprocal(out, out=out)


def silu(out, p):
    s = out.copy()
    sigmoid(s, p)
    out *= s


def hardsigmoid(out, p):
    alpha, beta = param(p, "alpha", 1 / 6), param(p, "beta", 0.5)
    out *= alpha
    out += beta
    np.clip(out, 0, 1, out=out)


def hardswish(out, p):
    s = out.copy()
    hardsigmoid(s, p)
    out *= s


def gelu(out, p):
    x = out.astype(np.float64)
    if p.get("approximate", "none") == "tanh":
        y = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    else:
        y = 0.5 * x * (1 + np.vectorize(math.erf, otypes=[np.float64])(x / math.sqrt(2)))
    out[...] = y


def elu(out, p):
    alpha = param(p, "alpha", 1.0)
    neg = out < 0
    out[neg] = alpha * np.expm1(out[neg])


EPILOGUES = {
    "relu": lambda out, p: np.maximum(out, 0, out=out),
    "relu6": lambda out, p: np.clip(out, 0, 6, out=out),
    "clip": clip,
    "leaky_relu": leaky_relu,
    "sigmoid": sigmoid,
    "silu": silu,
    "hardsigmoid": hardsigmoid,
    "hardswish": hardswish,
    "gelu": gelu,
    "tanh": lambda out, p: np.tanh(out, out=out),
    "elu": elu,
}


def apply_activation(name: str | None, params: dict | None, out: np.ndarray) -> None:
    """Applies activation `name` to `out` in place (no-op for None)."""
    if name is None:
        return
    EPILOGUES[name](out, params or {})
