"""numba loops for softmax and the normalisations. Statistics accumulate in float64; nothing is allocated.

Inputs are viewed as 3-d (outer, n, inner) or 2-d (rows, n) C-contiguous arrays by the callers.
"""

from __future__ import annotations

import math

from numba import njit

_JIT = {"nogil": True, "cache": True}


@njit(**_JIT)
def softmax_loop(x, out, log):
    # x, out: (outer, n, inner); softmax over the middle axis.
    n = x.shape[1]
    for o in range(x.shape[0]):
        for i in range(x.shape[2]):
            m = -math.inf
            for j in range(n):
                m = max(m, float(x[o, j, i]))
            s = 0.0
            for j in range(n):
                s += math.exp(float(x[o, j, i]) - m)
            if log:
                shift = m + math.log(s)
                for j in range(n):
                    out[o, j, i] = float(x[o, j, i]) - shift
            else:
                inv = 1.0 / s
                for j in range(n):
                    out[o, j, i] = math.exp(float(x[o, j, i]) - m) * inv


@njit(**_JIT)
def layernorm_loop(x, out, weight, bias, eps, affine_w, affine_b):
    # x, out: (rows, n); weight/bias: (n,) when used.
    n = x.shape[1]
    for r in range(x.shape[0]):
        s = 0.0
        for j in range(n):
            s += x[r, j]
        mean = s / n
        v = 0.0
        for j in range(n):
            d = x[r, j] - mean
            v += d * d
        rstd = 1.0 / math.sqrt(v / n + eps)
        for j in range(n):
            y = (x[r, j] - mean) * rstd
            if affine_w:
                y = y * weight[j]
            if affine_b:
                y = y + bias[j]
            out[r, j] = y


@njit(**_JIT)
def groupnorm_loop(x, out, groups, weight, bias, eps, affine_w, affine_b):
    # x, out: (N, C, S); statistics per (sample, group of C/groups channels), affine per channel.
    c_all, size = x.shape[1], x.shape[2]
    cpg = c_all // groups
    count = cpg * size
    for b in range(x.shape[0]):
        for g in range(groups):
            c0 = g * cpg
            s = 0.0
            for c in range(c0, c0 + cpg):
                for k in range(size):
                    s += x[b, c, k]
            mean = s / count
            v = 0.0
            for c in range(c0, c0 + cpg):
                for k in range(size):
                    d = x[b, c, k] - mean
                    v += d * d
            rstd = 1.0 / math.sqrt(v / count + eps)
            for c in range(c0, c0 + cpg):
                w = weight[c] * rstd if affine_w else rstd
                sh = bias[c] if affine_b else 0.0
                for k in range(size):
                    out[b, c, k] = (x[b, c, k] - mean) * w + sh
