"""numba loops for the elementwise maths numpy has no single ufunc for (activations, erf).

Every loop reads `x[i]` before writing `out[i]`, so `x` and `out` may be the same buffer (in-place ops).
Arguments are 1-d contiguous arrays; scalars are computed in float64 and rounded once on store.
"""

from __future__ import annotations

import math

from numba import njit

_JIT = {"nogil": True, "cache": True}


@njit(**_JIT)
def erf_loop(x, out):
    for i in range(x.size):
        out[i] = math.erf(float(x[i]))


@njit(**_JIT)
def leaky_relu_loop(x, out, alpha):
    for i in range(x.size):
        v = x[i]
        out[i] = v if v > 0 else v * alpha


@njit(**_JIT)
def sigmoid_loop(x, out):
    for i in range(x.size):
        out[i] = 1.0 / (1.0 + math.exp(-float(x[i])))


@njit(**_JIT)
def silu_loop(x, out):
    for i in range(x.size):
        v = float(x[i])
        out[i] = v / (1.0 + math.exp(-v))


@njit(**_JIT)
def gelu_loop(x, out):
    for i in range(x.size):
        v = float(x[i])
        out[i] = 0.5 * v * (1.0 + math.erf(v * 0.7071067811865476))


@njit(**_JIT)
def gelu_tanh_loop(x, out):
    for i in range(x.size):
        v = float(x[i])
        out[i] = 0.5 * v * (1.0 + math.tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))


@njit(**_JIT)
def hardsigmoid_loop(x, out, alpha, beta):
    for i in range(x.size):
        out[i] = min(max(alpha * float(x[i]) + beta, 0.0), 1.0)


@njit(**_JIT)
def hardswish_loop(x, out, alpha, beta):
    for i in range(x.size):
        v = float(x[i])
        out[i] = v * min(max(alpha * v + beta, 0.0), 1.0)


@njit(**_JIT)
def elu_loop(x, out, alpha):
    for i in range(x.size):
        v = float(x[i])
        out[i] = v if v > 0 else alpha * math.expm1(v)


@njit(**_JIT)
def softplus_loop(x, out, beta, threshold):
    for i in range(x.size):
        v = float(x[i]) * beta
        out[i] = v / beta if v > threshold else (math.log1p(math.exp(-abs(v))) + max(v, 0.0)) / beta


@njit(**_JIT)
def mish_loop(x, out):
    # tanh(log1p(e^v)) = n / (n + 2) with n = e^v (e^v + 2): one exp instead of exp, log1p and tanh
    for i in range(x.size):
        v = float(x[i])
        if v > 20.0:
            out[i] = v
        else:
            e = math.exp(v)
            n = e * (e + 2.0)
            out[i] = v * n / (n + 2.0)


@njit(**_JIT)
def prelu_loop(x, out, slope):
    # x, out: (outer, C, inner); slope: (C,) (a single slope is broadcast by the caller)
    for o in range(x.shape[0]):
        for c in range(x.shape[1]):
            s = slope[c]
            for i in range(x.shape[2]):
                v = x[o, c, i]
                out[o, c, i] = v if v > 0 else v * s
