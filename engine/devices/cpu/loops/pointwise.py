"""numba loops for the elementwise maths numpy has no single ufunc for (activations, erf).

Every loop reads `x[i]` before writing `out[i]`, so `x` and `out` may be the same buffer (in-place ops).
Arguments are 1-d contiguous arrays; the float64 loops compute scalars in float64 and round once on store; the
float32 ones (`*_f32_*`) compute in float32 (hard-sigmoid's as the reference's numpy steps: two roundings).

`pass_team` runs one float32 pass (sigmoid, SiLU, erf GELU, hard-sigmoid with its alpha and beta from the job's
PASS_PARAMS) as a native OpenMP region function: each thread of the
team takes its share of the elements from the job's words (PASS_*) and runs the loop here, so a split pass never
enters Python on its threads (threads.run_native; split from Python, the second thread took the GIL 25-45 us after
the first on a 2-vCPU VM). It lives beside the loops it runs.
"""

from __future__ import annotations

import math

import numpy as np
from numba import carray, njit

from engine.devices.cpu.loops.native import f32_at, open_job, region

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


# The logistic function as Eigen's rational approximation p(x) / q(x) + 1/2 on x clamped to [-18, 18] (the one
# ONNX Runtime's MLAS evaluates), in float32: no exp and no branch, so LLVM vectorises the loop (8 lanes on AVX2),
# where the float64 libm loops above take 4-7 ns an element and oneDNN's exp-based swish about 0.85 (AVX2 EPYC,
# one thread). Absolute error below 2e-7 on the logistic against float64 (tests), the result clamped to [0, 1].
_F32_LOOP = {"nogil": True, "cache": True, "fastmath": {"contract"}, "error_model": "numpy", "boundscheck": False}


@njit(inline="always", **_F32_LOOP)
def _logistic_f32(v):
    # constants made here, not module globals: numba typed those as float64 and the loops ran scalar (5 ns/element)
    c = min(max(v, np.float32(-18.0)), np.float32(18.0))
    s = c * c
    p = np.float32(4.37031012579801e-11)  # odd numerator, x^9 ... x^1
    p = p * s + np.float32(1.15627324459942e-07)
    p = p * s + np.float32(6.08574864600143e-05)
    p = p * s + np.float32(8.51377133304701e-03)
    p = (p * s + np.float32(2.48287947061529e-01)) * c
    q = np.float32(6.10247389755681e-13)  # even denominator, x^10 ... x^0
    q = q * s + np.float32(5.76102136993427e-09)
    q = q * s + np.float32(6.29106785017040e-06)
    q = q * s + np.float32(1.70198817374094e-03)
    q = q * s + np.float32(1.16817656904453e-01)
    q = q * s + np.float32(9.93151921023180e-01)
    return min(max(p / q + np.float32(0.5), np.float32(0.0)), np.float32(1.0))


@njit(**_F32_LOOP)
def silu_f32_range(x, out, lo, hi):
    """out[i] = x[i] * logistic(x[i]) for i in [lo, hi), float32 (x may be out)."""
    xs, ys = x[lo:hi], out[lo:hi]
    for i in range(xs.size):  # over slices: range(lo, hi) indexing kept the loop scalar (negative-index checks)
        v = xs[i]
        ys[i] = v * _logistic_f32(v)


@njit(**_F32_LOOP)
def silu_f32_inplace(y, lo, hi):
    """y[i] = y[i] * logistic(y[i]) for i in [lo, hi), float32: the in-place form has one array, as LLVM's runtime
    overlap check sends two arrays that are one buffer to the scalar loop (4 ns an element instead of 0.5)."""
    ys = y[lo:hi]
    for i in range(ys.size):
        v = ys[i]
        ys[i] = v * _logistic_f32(v)


@njit(**_F32_LOOP)
def sigmoid_f32_inplace(y, lo, hi):
    """y[i] = logistic(y[i]) for i in [lo, hi), float32 (see silu_f32_inplace)."""
    ys = y[lo:hi]
    for i in range(ys.size):
        ys[i] = _logistic_f32(ys[i])


@njit(**_F32_LOOP)
def sigmoid_f32_range(x, out, lo, hi):
    """out[i] = logistic(x[i]) for i in [lo, hi), float32 (x may be out)."""
    xs, ys = x[lo:hi], out[lo:hi]
    for i in range(xs.size):
        ys[i] = _logistic_f32(xs[i])


@njit(inline="always", **_F32_LOOP)
def _gelu_f32(v):
    # 0.5 v (1 + erf(v / sqrt 2)), erf as Eigen's rational approximation x P(x^2) / Q(x^2) on x clamped to [-4, 4]
    x = min(max(v * np.float32(0.7071067811865476), np.float32(-4.0)), np.float32(4.0))
    s = x * x
    p = np.float32(-2.72614225801306e-10)  # odd numerator, x^13 ... x^1
    p = p * s + np.float32(2.77068142495902e-08)
    p = p * s + np.float32(-2.10102402082508e-06)
    p = p * s + np.float32(-5.69250639462346e-05)
    p = p * s + np.float32(-7.34990630326855e-04)
    p = p * s + np.float32(-2.95459980854025e-03)
    p = (p * s + np.float32(-1.60960333262415e-02)) * x
    q = np.float32(-1.45660718464996e-05)  # even denominator, x^8 ... x^0
    q = q * s + np.float32(-2.13374055278905e-04)
    q = q * s + np.float32(-1.68282697438203e-03)
    q = q * s + np.float32(-7.37332916720468e-03)
    q = q * s + np.float32(-1.42647390514189e-02)
    erf = min(max(p / q, np.float32(-1.0)), np.float32(1.0))
    return np.float32(0.5) * v * (np.float32(1.0) + erf)


@njit(**_F32_LOOP)
def gelu_f32_range(x, out, lo, hi):
    """out[i] = gelu(x[i]) (erf form) for i in [lo, hi), float32 (x is not out: see silu_f32_inplace)."""
    xs, ys = x[lo:hi], out[lo:hi]
    for i in range(xs.size):
        ys[i] = _gelu_f32(xs[i])


@njit(**_F32_LOOP)
def gelu_f32_inplace(y, lo, hi):
    """y[i] = gelu(y[i]) (erf form) for i in [lo, hi), float32."""
    ys = y[lo:hi]
    for i in range(ys.size):
        ys[i] = _gelu_f32(ys[i])


# `job` (int64 words) of `pass_team`: the addresses of omp_get_thread_num and omp_get_num_threads, the function
# (PASS_SIGMOID, PASS_SILU, PASS_GELU), the element count, and the input and output addresses (the same one for an
# in-place pass).
PASS_THREAD_NUM, PASS_NUM_THREADS, PASS_KIND, PASS_N, PASS_X, PASS_OUT, PASS_PARAMS, PASS_LEN = range(8)
# PASS_PARAMS: the address of the pass's float32 parameters (hard-sigmoid's alpha and beta; 0 for the others)
PASS_SIGMOID, PASS_SILU, PASS_GELU, PASS_HARDSIGMOID = range(4)
_PASS_ALIGN = 16  # a thread's share starts on a multiple of this many elements (a 64-byte line)


@njit(nogil=True, cache=True)
def pass_share(n, t, team):
    """[lo, hi) of the n elements for thread t of `team`: equal shares, each starting on a _PASS_ALIGN multiple."""
    team = max(team, 1)
    step = ((n + team - 1) // team + _PASS_ALIGN - 1) // _PASS_ALIGN * _PASS_ALIGN
    lo = min(t * step, n)
    return lo, min(lo + step, n)


@njit(nogil=True, cache=True)
def hardsigmoid_f32_inplace(y, alpha, beta, lo, hi):
    """y = clip(y * alpha + beta, 0, 1) over [lo, hi) in float32, two roundings as the reference's numpy steps (no
    contraction: this loop has no fastmath), NaN kept (both tests false)."""
    zero, one = np.float32(0.0), np.float32(1.0)
    for i in range(lo, hi):
        v = y[i] * alpha + beta
        y[i] = zero if v < zero else (one if v > one else v)


@njit(nogil=True, cache=True)
def hardsigmoid_f32_range(x, out, alpha, beta, lo, hi):
    """out = clip(x * alpha + beta, 0, 1) over [lo, hi), as hardsigmoid_f32_inplace."""
    zero, one = np.float32(0.0), np.float32(1.0)
    for i in range(lo, hi):
        v = x[i] * alpha + beta
        out[i] = zero if v < zero else (one if v > one else v)


@region
def pass_team(data):
    """One OpenMP thread's share of a float32 pass (see PASS_*): in place when input and output are one buffer."""
    job, t, team = open_job(data, PASS_LEN)
    n, kind = job[PASS_N], job[PASS_KIND]
    lo, hi = pass_share(n, t, team)
    if lo >= hi:
        return
    out = carray(f32_at(job[PASS_OUT]), (n,))
    if kind == PASS_HARDSIGMOID:
        params = carray(f32_at(job[PASS_PARAMS]), (2,))
        if job[PASS_X] == job[PASS_OUT]:
            hardsigmoid_f32_inplace(out, params[0], params[1], lo, hi)
        else:
            hardsigmoid_f32_range(carray(f32_at(job[PASS_X]), (n,)), out, params[0], params[1], lo, hi)
        return
    if job[PASS_X] == job[PASS_OUT]:
        if kind == PASS_SIGMOID:
            sigmoid_f32_inplace(out, lo, hi)
        elif kind == PASS_SILU:
            silu_f32_inplace(out, lo, hi)
        else:
            gelu_f32_inplace(out, lo, hi)
        return
    x = carray(f32_at(job[PASS_X]), (n,))
    if kind == PASS_SIGMOID:
        sigmoid_f32_range(x, out, lo, hi)
    elif kind == PASS_SILU:
        silu_f32_range(x, out, lo, hi)
    else:
        gelu_f32_range(x, out, lo, hi)
