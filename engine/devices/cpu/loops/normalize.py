"""numba loops for softmax and the normalisations. Statistics accumulate in float64; nothing is allocated but
LayerNorm's small per-call scratch of row statistics.

Inputs are viewed as 3-d (outer, n, inner) or 2-d (rows, n) C-contiguous arrays by the callers.
"""

from __future__ import annotations

import math

import numpy as np
from numba import carray, njit

from engine.devices.cpu.loops.native import f32_at, f64_at, open_job, region, team_share

# numpy's error model: a division by zero (LayerNorm with eps 0 over a constant row) gives inf / NaN as the
# reference and torch do, where Python's model raised ZeroDivisionError out of the kernel.
_JIT = {"nogil": True, "cache": True, "error_model": "numpy"}
# Reassociation lets LLVM keep the float64 sums in vector lanes (the statistics stay float64, two-pass); no
# nnan/ninf: a NaN or inf in a row still propagates.
_FAST = {**_JIT, "fastmath": {"reassoc", "contract", "nsz"}}


@njit(**_JIT)
def softmax_loop(x, out, log, empty_is_zero):
    # x, out: (outer, n, inner); softmax over the middle axis. A row that is all -inf gives NaN as torch's
    # softmax does, or zeros with `empty_is_zero` (attention rows with nothing to attend to).
    n = x.shape[1]
    for o in range(x.shape[0]):
        for i in range(x.shape[2]):
            m = -math.inf
            for j in range(n):
                m = max(m, float(x[o, j, i]))
            if empty_is_zero and m == -math.inf:
                for j in range(n):
                    out[o, j, i] = 0.0
                continue
            s = 0.0
            if log:
                for j in range(n):
                    s += math.exp(float(x[o, j, i]) - m)
                shift = m + math.log(s)
                for j in range(n):
                    out[o, j, i] = float(x[o, j, i]) - shift
            else:
                # out[j] is written only after x[j] was read, so x may be out (in place)
                for j in range(n):
                    e = math.exp(float(x[o, j, i]) - m)
                    out[o, j, i] = e
                    s += e
                inv = 1.0 / s
                for j in range(n):
                    out[o, j, i] *= inv


@njit(**_FAST)
def layernorm_rows(x, z, has_z, out, weight, bias, eps, affine_w, affine_b, lo, hi):
    """Rows [lo, hi) of x, out: (rows, n), normalised over n: out = LN(x (+ z)) with weight/bias (n,) float64 when
    used. With has_z the row is first x + z in x's own type (what the Add it replaces computes), kept in out's row
    until the last pass overwrites it. Mean and variance in float64, two passes (`_layernorm_chunks`)."""
    if has_z:
        for r in range(lo, hi):
            xr, zr, orow = x[r], z[r], out[r]
            for j in range(x.shape[1]):
                orow[j] = xr[j] + zr[j]
        _layernorm_chunks(out, out, weight, bias, eps, affine_w, affine_b, lo, hi)
    else:
        _layernorm_chunks(x, out, weight, bias, eps, affine_w, affine_b, lo, hi)


# `job` (int64 words) of `layernorm_team`: the addresses of omp_get_thread_num and omp_get_num_threads; the rows and
# their length; the float32 input and output, the float64 weight and bias (n,) and eps (1,); whether the weight and
# the bias apply.
(LN_THREAD_NUM, LN_NUM_THREADS, LN_ROWS, LN_N, LN_X, LN_OUT, LN_WEIGHT, LN_BIAS, LN_EPS, LN_HAS_W, LN_HAS_B,
 LN_LEN) = range(12)


@region
def layernorm_team(data):
    """One OpenMP thread's share of the rows of a float32 layernorm_rows call without z (see LN_*); called outside
    a region, all of them (a native program's record: devices/cpu/fused_calls.py)."""
    job, t, team = open_job(data, LN_LEN)
    rows, n = job[LN_ROWS], job[LN_N]
    lo, hi = team_share(rows, t, team)
    if lo >= hi:
        return
    x = carray(f32_at(job[LN_X]), (rows, n))
    out = carray(f32_at(job[LN_OUT]), (rows, n))
    weight, bias = carray(f64_at(job[LN_WEIGHT]), (n,)), carray(f64_at(job[LN_BIAS]), (n,))
    eps = carray(f64_at(job[LN_EPS]), (1,))[0]
    # what layernorm_rows runs without z, called directly (its literal False would make another overload of it)
    _layernorm_chunks(x, out, weight, bias, eps, job[LN_HAS_W] != 0, job[LN_HAS_B] != 0, lo, hi)


# Rows per chunk of `_layernorm_chunks`: their statistics (2 float64 each) in one small scratch per call.
LN_CHUNK = 64


@njit(**_FAST)
def _layernorm_chunks(x, out, weight, bias, eps, affine_w, affine_b, lo, hi):
    """layernorm_rows without z, by chunks of LN_CHUNK rows, each pass over every row of the chunk before the next
    (the means, then the variances and 1/std, then the outputs): one row's sum -> mean -> squares -> sqrt chain
    no longer stalls the next row, and no runtime choice of row (x or out) sits in the loops. MobileViT-XXS's
    (1024, 64) LayerNorms 56 -> 38 us CPU, (341, 192) 40 -> 31; the same float64 sums, the same outputs."""
    n = x.shape[1]
    stats = np.empty(2 * LN_CHUNK)  # means, then 1/std
    for c0 in range(lo, hi, LN_CHUNK):
        c1 = min(hi, c0 + LN_CHUNK)
        for r in range(c0, c1):
            src = x[r]
            s = 0.0
            for j in range(n):
                s += src[j]
            stats[r - c0] = s / n
        for r in range(c0, c1):
            src = x[r]
            mean = stats[r - c0]
            q = 0.0
            for j in range(n):
                d = src[j] - mean
                q += d * d
            stats[LN_CHUNK + r - c0] = 1.0 / math.sqrt(q / n + eps)
        for r in range(c0, c1):
            src, orow = x[r], out[r]
            mean, rstd = stats[r - c0], stats[LN_CHUNK + r - c0]
            if affine_w and affine_b:
                for j in range(n):
                    orow[j] = (src[j] - mean) * rstd * weight[j] + bias[j]
            elif affine_w:
                for j in range(n):
                    orow[j] = (src[j] - mean) * rstd * weight[j]
            elif affine_b:
                for j in range(n):
                    orow[j] = (src[j] - mean) * rstd + bias[j]
            else:
                for j in range(n):
                    orow[j] = (src[j] - mean) * rstd


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


@njit(**_JIT)
def argbest_loop(x, out, largest):
    # x: (outer, n, inner), out: (outer, inner) int64. First index of the max (min); NaN counts as the max
    # (and the min), as torch. Walks j outermost so the inner axis is read contiguously; `out` holds the best.
    for o in range(x.shape[0]):
        for i in range(x.shape[2]):
            out[o, i] = 0
        for j in range(1, x.shape[1]):
            for i in range(x.shape[2]):
                v, best = x[o, j, i], x[o, out[o, i], i]
                if best != best:
                    continue
                if v != v or (v > best if largest else v < best):
                    out[o, i] = j
