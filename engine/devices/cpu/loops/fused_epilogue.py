"""numba loops of the fused epilogue: bias, residual and activation in one pass over an output, no temporaries.

Every activation of SPEC.md's fused epilogue has a code (ACT_CODES) and up to three params p0..p2 (act_code);
`activate`, `activate_cheap` and `activate_row` are inlined into the conv loops (conv/loops.py), `epilogue`
finishes a conv's (O, L) output, `epilogue_cols` a Gemm's (rows, N) output. Items [lo, hi) are split by
threads.parallel_for.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

ACT_NONE = 0


@njit(nogil=True, cache=True, inline="always")
def activate_row(row, act, p0, p1, p2):
    """The activation over a 1-D row in place; the cheap ones in a loop of their own so it vectorises."""
    if act == 0:
        return
    if act <= 3:
        for k in range(row.shape[0]):
            row[k] = activate_cheap(row[k], act, p0, p1, p2)
    else:
        for k in range(row.shape[0]):
            row[k] = activate(row[k], act, p0, p1, p2)


@njit(nogil=True, cache=True, inline="always")
def activate_cheap(v, act, p0, p1, p2):
    """Activations 0-3 (none, relu, clip, leaky_relu), cheap enough to vectorise in the float32 loops."""
    if act == 1:  # Python's max: v unless 0 > v, so NaN stays NaN and -inf gives 0 (v * 0 would give NaN)
        return max(v, 0.0)
    if act == 2:
        return min(max(v, p0), p1)
    if act == 3:
        return v if v >= 0 else v * p2
    return v


@njit(nogil=True, cache=True, inline="always")
def activate(v, act, p0, p1, p2):
    """The fused activation `act` (see ACT_CODES) of one value, computed in float64."""
    x = np.float64(v)
    if act <= 3:
        return activate_cheap(x, act, p0, p1, p2)
    if act == 4:
        return 1.0 / (1.0 + math.exp(-x))
    if act == 5:
        return x / (1.0 + math.exp(-x))
    if act == 6:
        return min(max(x * p0 + p1, 0.0), 1.0)
    if act == 7:
        return x * min(max(x * p0 + p1, 0.0), 1.0)
    if act == 8:
        return math.tanh(x)
    if act == 9:
        return x if x > 0 else p2 * math.expm1(x)
    if act == 10:
        return 0.5 * x * (1.0 + math.erf(x * 0.7071067811865476))
    return 0.5 * x * (1.0 + math.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


@njit(nogil=True, cache=True)
def epilogue(y, bias, z, has_z, act, p0, p1, p2, lo, hi):
    """y[o, l] = act(y[o, l] + bias[o] (+ z[o, l])) in place for o in [lo, hi); y and z are (O, L) views."""
    for o in range(lo, hi):
        row, b = y[o], bias[o]
        if has_z:
            zrow = z[o]
            for k in range(row.shape[0]):
                row[k] += b + zrow[k]
            activate_row(row, act, p0, p1, p2)
        elif act <= 3:  # one pass for the cheap activations
            for k in range(row.shape[0]):
                row[k] = activate_cheap(row[k] + b, act, p0, p1, p2)
        else:
            for k in range(row.shape[0]):
                row[k] = activate(row[k] + b, act, p0, p1, p2)


@njit(nogil=True, cache=True)
def epilogue_cols(y, bias, has_bias, act, p0, p1, p2, lo, hi):
    """Gemm's epilogue: y[r, k] = act(y[r, k] + bias[k]) in place for rows r in [lo, hi)."""
    for r in range(lo, hi):
        row = y[r]
        if has_bias:
            for k in range(row.shape[0]):
                row[k] += bias[k]
        activate_row(row, act, p0, p1, p2)


ACT_CODES = {None: 0, "relu": 1, "relu6": 2, "clip": 2, "leaky_relu": 3, "sigmoid": 4, "silu": 5, "hardsigmoid": 6,
             "hardswish": 7, "tanh": 8, "elu": 9, "gelu": 10}


def act_code(name: str | None, params: dict | None) -> tuple[int, float, float, float] | None:
    """(code, p0, p1, p2) for the numba epilogues, None for an activation they do not know."""
    p = params or {}
    if name not in ACT_CODES:
        return None
    code = ACT_CODES[name]
    if name == "relu6":
        return code, 0.0, 6.0, 0.0
    if name == "clip":
        lo, hi = p.get("min"), p.get("max")
        return code, -np.inf if lo is None else float(lo), np.inf if hi is None else float(hi), 0.0
    if name in ("hardsigmoid", "hardswish"):
        return code, float(p.get("alpha", 1 / 6)), float(p.get("beta", 0.5)), 0.0
    if name == "gelu" and p.get("approximate", "none") == "tanh":
        return 11, 0.0, 0.0, 0.0
    return code, 0.0, 0.0, float(p.get("alpha", 1.0 if name == "elu" else 0.01))
