"""Requantization inside oneDNN's convolution, bit-exact with TNN's: per-channel weight scales and a float bias.

TNN requantizes the int32 sum of products A plus its bias b as float2int8(fl(float(A + b) * s)) (requant.py).
Given per-output-channel weight scales c (dnnl_primitive_attr_set_scales_mask) and a float bias B, every int8
convolution kernel oneDNN 3.2 has on x86 (brgconv, brgconv_1x1, brdgmm_dw, jit_int8: the `store` of each)
converts A to float, multiplies by c, then adds B, each rounding once (vcvtdq2ps, vmulps, vaddps: no fused
multiply-add), applies the eltwise post-ops, saturates to [-128, 127] and stores rounding half to even:
q = rne(fl(fl(float(A) * c) + B)). No binary post-op multiplies after it, as the factors of requant.py need.

With c = s and B = fl(b * s) the two roundings differ from TNN's one now and then, so `scaled_factors` looks, per
channel, for c a few ulps around s and B a few ulps around fl(b * s) for which both agree on every A the channel
can produce (`A` in sum_range minus b). The check is a proof, not a sample: both q(A) are monotone
non-decreasing step functions of A (each step - int to float, a product by c >= 0, a sum, ReLU, the ceiling,
saturation, rounding - is monotone), and two such functions are equal on [lo, hi] if and only if they agree at lo,
at hi, and on both sides of every point where TNN's steps (`transitions`, found exactly by bisection: at most
255). A layer takes this way only when every channel has such a pair; otherwise it keeps requant.py's factors.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from engine.devices.cpu.int8.requant import activate, round_onednn, round_tnn, sum_range

F32 = np.float32
C_STEPS = 16  # ulps tried either side of s
B_STEPS = 32  # ulps tried either side of fl(b * s)
MAX_STEPS = 256  # TNN's q takes at most 256 values: at most 255 steps


@njit(nogil=True, cache=True)
def q_tnn(a, b, s, act, top):
    """TNN's int8 output for the sum of products a: float2int8(fl(float(a + b) * s)), then the activation
    (act 0 none / 1 relu / 2 relu6 up to `top`)."""
    return activate(round_tnn(F32(a + b) * s), act, top)


@njit(nogil=True, cache=True)
def q_scaled(a, c, bb, act, top):
    """oneDNN's int8 output for the sum of products a with weight scale c and float bias bb."""
    return activate(round_onednn(F32(a) * c + bb), act, top)


@njit(nogil=True, cache=True)
def transitions(b, s, a_lo, a_hi, act, top, out):
    """The points t in (a_lo, a_hi] where q_tnn(t - 1) != q_tnn(t), into `out`; returns their count. Bisection on
    the monotone q_tnn: exact, whatever float32 does near a step."""
    n = 0
    a, q = a_lo, q_tnn(a_lo, b, s, act, top)
    q_end = q_tnn(a_hi, b, s, act, top)
    while q < q_end:
        lo, hi = a, a_hi  # q_tnn(lo) == q < q_tnn(hi)
        while hi - lo > 1:
            mid = lo + (hi - lo) // 2
            if q_tnn(mid, b, s, act, top) > q:
                hi = mid
            else:
                lo = mid
        out[n] = hi
        n += 1
        a, q = hi, q_tnn(hi, b, s, act, top)
    return n


@njit(nogil=True, cache=True)
def agrees(b, s, c, bb, a_lo, a_hi, act, top, steps, n_steps):
    """Whether q_scaled(c, bb) equals q_tnn(b, s) for every a in [a_lo, a_hi], given TNN's `steps`."""
    if q_scaled(a_lo, c, bb, act, top) != q_tnn(a_lo, b, s, act, top):
        return False
    if q_scaled(a_hi, c, bb, act, top) != q_tnn(a_hi, b, s, act, top):
        return False
    for i in range(n_steps):
        t = steps[i]
        if q_scaled(t - 1, c, bb, act, top) != q_tnn(t - 1, b, s, act, top):
            return False
        if q_scaled(t, c, bb, act, top) != q_tnn(t, b, s, act, top):
            return False
    return True


@njit(nogil=True, cache=True)
def _ulps(x, k):
    """x moved k ulps (up for k > 0)."""
    for _ in range(abs(k)):
        x = np.nextafter(x, F32(np.inf) if k > 0 else F32(-np.inf))
    return x


@njit(nogil=True, cache=True)
def _solve(b, s, a_lo, a_hi, act, top, steps):
    """(c, bb, True) for one channel, or (s, fl(b * s), False): c from s outwards (s, +1, -1, +2, ... ulps),
    for each bb from fl(b * s) outwards; never c < 0."""
    n_steps = transitions(b, s, a_lo, a_hi, act, top, steps)
    b0 = F32(F32(b) * s)
    for i in range(2 * C_STEPS + 1):
        c = _ulps(s, (i + 1) // 2 * (1 if i % 2 else -1))
        if c < F32(0.0):
            continue
        for j in range(2 * B_STEPS + 1):
            bb = _ulps(b0, (j + 1) // 2 * (1 if j % 2 else -1))
            if agrees(b, s, c, bb, a_lo, a_hi, act, top, steps, n_steps):
                return c, bb, True
    return s, b0, False


@njit(nogil=True, cache=True)
def _search(scale, bias, n_lo, n_hi, act, tops, c_out, b_out):
    """Fills c_out, b_out channel by channel; returns the first channel without a pair, or -1 when all have
    one (the search stops there: the layer then keeps requant.py's factors)."""
    steps = np.empty(MAX_STEPS, np.int64)
    for ch in range(scale.shape[0]):
        b, s = np.int64(bias[ch]), scale[ch]
        c, bb, ok = _solve(b, s, n_lo[ch] - b, n_hi[ch] - b, act, tops[ch], steps)
        if not ok:
            return ch
        c_out[ch], b_out[ch] = c, bb
    return -1


def scaled_factors(scale: np.ndarray, weight: np.ndarray, bias: np.ndarray, act: int = 0,
                   relu6_max: np.ndarray | None = None, unsigned: bool = False) \
        -> tuple[np.ndarray, np.ndarray] | None:
    """(weight scales, float bias) with which oneDNN's convolution rounds every reachable sum as TNN, after the
    activation (act 0 none / 1 relu / 2 relu6 up to relu6_max), or None when a channel has no such pair, a factor
    is negative or not finite. The caller checks requant.exact_sums (the int32 sums themselves exact)."""
    scale = np.ascontiguousarray(scale, F32).reshape(-1)
    if not np.all(np.isfinite(scale)) or np.any(scale < 0):
        return None
    n_lo, n_hi = sum_range(weight, bias, unsigned)
    tops = np.full(scale.size, 127, np.int64) if relu6_max is None else np.asarray(relu6_max, np.int64)
    c, bb = np.empty_like(scale), np.empty_like(scale)
    if _search(scale, np.asarray(bias, np.int64).reshape(-1), n_lo, n_hi, act, tops, c, bb) >= 0:
        return None
    return c, bb
