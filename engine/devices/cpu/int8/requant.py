"""Requantization on oneDNN, bit-exact with TNN's: the per-channel factors oneDNN multiplies by.

TNN requantizes an int32 sum N (products plus bias) as float2int8(fl(N * s)): add +-0.5 in float32, clamp to
[-128, 127], truncate. oneDNN's int8 convolution, given the bias as float and s as a per-channel `binary mul`
post-op, computes the same fl(N * s) as long as its own steps are exact: the products' sum is an integer below
2**24 (`exact_sums`), so converting it to float is exact, and the bias is a float32 exactly, so adding it rounds
once, as TNN's float(acc + bias) does. It then stores to int8 rounding half to even. The two differ only where
fl(N * s) is a tie k + 0.5 (about one channel in ten of MobileNetV2 has one within its range), and at the
float32 quirk fl(0.49999997 + 0.5) = 1.

`tie_free_scales` moves each channel's factor up by a few ulps (s' = s, nextafter(s), ...) until
round_half_even(fl(N * s')) equals TNN's rounding of fl(N * s) (after the activation) for every N the layer can
produce (`sum_range`: the bias plus the least and most the products can sum to, inputs in [-128, 127], or in
[0, 127] when unsigned). Both are monotone step functions of N, so comparing them on windows around every step
(N near (k + 0.5) / s for each int8 boundary k) proves them equal everywhere. Where no single factor fits (a tie
and a value an ulp below another tie in the range: 0.4% of TNN's MobileNetV2's channels, 5% of one we quantized
with per-channel activation scales), two chained factors fl(fl(N * s1) * s2) with s1 = 1 +- j * 2**-21 round
differently and fit 90% of those (a second binary-mul post-op). A channel left over keeps s, and `suspects`
lists the int8 outputs oneDNN can give there where TNN gives another (a tie's even neighbour, after the
activation); the kernel recomputes exactly the elements that came out as one of them (conv.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit

F32 = np.float32
EXACT_LIMIT = 1 << 24  # below this every integer is a float32, so oneDNN's int -> float steps are exact
MAX_STEPS = 8  # ulps tried above s (and above s / s1)
PAIR_STEPS = 32  # first factors 1 +- j * 2**-21 tried
WINDOW = 2  # N within this of a step's real-valued position: fl() moves a product by far less than one s


def product_bound(weight: np.ndarray, largest_input: int = 128) -> np.ndarray:
    """Per output channel, the largest |sum of products| any input of magnitude up to `largest_input` can give
    (128: int8 inputs in [-128, 127]; 255: u8 ones)."""
    return np.abs(weight.reshape(weight.shape[0], -1).astype(np.int64)).sum(axis=1) * largest_input


def sum_bound(weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Per output channel, the largest |sum of products + bias|."""
    return product_bound(weight) + np.abs(bias.astype(np.int64).reshape(-1))


def sum_range(weight: np.ndarray, bias: np.ndarray, unsigned: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per output channel, the least and the most sum of products + bias: inputs in [-128, 127], or [0, 127]."""
    w = weight.reshape(weight.shape[0], -1).astype(np.int64)
    pos, neg = np.where(w > 0, w, 0).sum(axis=1), np.where(w < 0, -w, 0).sum(axis=1)
    b = bias.astype(np.int64).reshape(-1)
    if unsigned:
        return b - 127 * neg, b + 127 * pos
    return b - 128 * pos - 127 * neg, b + 127 * pos + 128 * neg


def exact_sums(weight: np.ndarray) -> bool:
    """Whether oneDNN's int32 sums are exact and exactly floats: every |sum| < 2**24 (above, its s8-input path
    rounds through float)."""
    return bool(np.all(product_bound(weight) < EXACT_LIMIT))


def exact_u8_sums(weight: np.ndarray) -> bool:
    """exact_sums for u8 inputs (0..255: an int8 input with zero point 128, before oneDNN takes it off)."""
    return bool(np.all(product_bound(weight, 255) < EXACT_LIMIT))


def exact_bias(bias: np.ndarray) -> bool:
    """Whether every bias is a float32 exactly, so that oneDNN's float bias add rounds once, as TNN's."""
    b = np.asarray(bias, np.int64)
    return bool(np.all(b.astype(np.float32).astype(np.int64) == b))


@njit(nogil=True, cache=True)
def round_tnn(v):
    """TNN's float2int8 on a float32 scalar (as an int)."""
    v = v + (F32(0.5) if v >= F32(0.0) else F32(-0.5))
    v = min(max(v, F32(-128.0)), F32(127.0))
    return int(v)  # truncates toward zero


@njit(nogil=True, cache=True)
def round_onednn(v):
    """oneDNN's f32 -> s8 store on a float32 scalar: saturate to [-128, 127], round half to even."""
    v = min(max(v, F32(-128.0)), F32(127.0))
    r = np.floor(v)
    d = v - r  # exact: |v| < 2**23
    q = int(r)
    if d > F32(0.5) or (d == F32(0.5) and q % 2 != 0):
        q += 1
    return q


@njit(nogil=True, cache=True)
def activate(q, act, top):
    if act == 1:
        return max(q, 0)
    if act == 2:
        return min(max(q, 0), top)
    return q


OK = np.iinfo(np.int64).max  # `first_mismatch` found none


@njit(nogil=True, cache=True)
def _mismatch(n, s, s1, s2, act, top):
    nf = F32(n)
    return activate(round_tnn(nf * s), act, top) != activate(round_onednn((nf * s1) * s2), act, top)


@njit(nogil=True, cache=True)
def first_mismatch(s, s1, s2, n_lo, n_hi, act, top):
    """The first N in [n_lo, n_hi] where oneDNN's rounding of fl(fl(N * s1) * s2) differs from TNN's of fl(N * s)
    after the activation (act 0 none / 1 relu / 2 relu6 up to `top`), or OK (s, s1, s2 > 0)."""
    inv_s, inv_c = 1.0 / np.float64(s), 1.0 / (np.float64(s1) * np.float64(s2))
    for k in range(-128, 127):
        t, tc = (k + 0.5) * inv_s, (k + 0.5) * inv_c
        lo, hi = int(np.floor(min(t, tc))) - WINDOW, int(np.ceil(max(t, tc))) + WINDOW
        if hi < n_lo or lo > n_hi:
            continue
        for n in range(max(lo, n_lo), min(hi, n_hi) + 1):
            if _mismatch(n, s, s1, s2, act, top):
                return n
    return OK


@njit(nogil=True, cache=True)
def agrees(s, c, n_lo, n_hi, act, top):
    """Whether the single factor c gives TNN's rounding of fl(N * s) for every N in [n_lo, n_hi]."""
    return first_mismatch(s, F32(1.0), c, n_lo, n_hi, act, top) == OK


@njit(nogil=True, cache=True)
def _mark_suspects(s, n_lo, n_hi, act, top, row):
    """row[q + 128] = True for every output q (after the activation) that oneDNN's rounding of fl(N * s) gives
    where TNN's gives another, over N in [n_lo, n_hi]."""
    inv_s = 1.0 / np.float64(s)
    for k in range(-128, 127):
        t = (k + 0.5) * inv_s
        lo, hi = int(np.floor(t)) - WINDOW, int(np.ceil(t)) + WINDOW
        if hi < n_lo or lo > n_hi:
            continue
        for n in range(max(lo, n_lo), min(hi, n_hi) + 1):
            v = F32(n) * s
            got = activate(round_onednn(v), act, top)
            if got != activate(round_tnn(v), act, top):
                row[got + 128] = True


def suspects(scale: np.ndarray, weight: np.ndarray, bias: np.ndarray, channels: np.ndarray, act: int,
             relu6_max: np.ndarray, unsigned: bool = False) -> np.ndarray:
    """(len(channels), 256) table: True at q + 128 for the outputs to recompute in each channel (its factor left
    at s); act 0 none / 1 relu / 2 relu6 (relu6_max: the int8 ceilings)."""
    lo, hi = sum_range(weight, bias, unsigned)
    table = np.zeros((channels.size, 256), np.bool_)
    for i, c in enumerate(channels):
        if scale[c] > 0:
            _mark_suspects(F32(scale[c]), lo[c], hi[c], act, int(relu6_max[c]), table[i])
    return table


@njit(nogil=True, cache=True)
def _solve(s, n_lo, n_hi, act, top, hot):
    """(s1, s2) with oneDNN's fl(fl(N * s1) * s2) rounded as TNN's fl(N * s), or (0, 0): first s1 = 1 and s2 a
    few ulps above s, then s1 = 1 +- j * 2**-21 with s2 around s / s1. Each pair is tried on the N where earlier
    pairs failed (`hot`) before the full windows, which rejects most pairs at once."""
    n_hot = 0
    for j in range(PAIR_STEPS + 1):
        for sign in (1.0, -1.0):
            if j == 0 and sign < 0:
                continue
            s1 = F32(1.0 + sign * j * 2.0 ** -21)
            s2 = s if j == 0 else F32(np.float64(s) / np.float64(s1))
            if j > 0:
                for _ in range(2):
                    s2 = np.nextafter(s2, F32(0.0))
            for _ in range(MAX_STEPS + 1):
                bad = False
                for i in range(n_hot):
                    if _mismatch(hot[i], s, s1, s2, act, top):
                        bad = True
                        break
                if not bad:
                    n = first_mismatch(s, s1, s2, n_lo, n_hi, act, top)
                    if n == OK:
                        return s1, s2
                    if n_hot < hot.shape[0]:
                        hot[n_hot] = n
                        n_hot += 1
                s2 = np.nextafter(s2, F32(np.inf))
    return F32(0.0), F32(0.0)


@njit(nogil=True, cache=True)
def _search(scale, n_lo, n_hi, act, tops, first, second):
    hot = np.empty(16, np.int64)
    for ch in range(scale.shape[0]):
        s = scale[ch]
        first[ch], second[ch] = F32(1.0), s
        if s == F32(0.0):
            continue  # 0 both ways
        first[ch], second[ch] = _solve(s, n_lo[ch], n_hi[ch], act, tops[ch], hot)


def tie_free_scales(scale: np.ndarray, weight: np.ndarray, bias: np.ndarray, act: int = 0,
                    relu6_max: np.ndarray | None = None, unsigned: bool = False) \
        -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(first factors, second factors, channels no pair makes exact) for oneDNN's two binary-mul post-ops
    (first is all 1 when one factor does everywhere), or None when a factor is negative or not finite, or a
    product could leave int32. Outputs the activation (act 0 none / 1 relu / 2 relu6 up to relu6_max) makes
    equal need not agree. The caller checks exact_sums and exact_bias."""
    scale = np.ascontiguousarray(scale, F32).reshape(-1)
    if not np.all(np.isfinite(scale)) or np.any(scale < 0):
        return None
    if np.any(scale.astype(np.float64) * sum_bound(weight, bias) >= 2.0 ** 31):
        return None
    n_lo, n_hi = sum_range(weight, bias, unsigned)
    tops = np.full(scale.size, 127, np.int64) if relu6_max is None else np.asarray(relu6_max, np.int64)
    first, second = np.empty_like(scale), np.empty_like(scale)
    _search(scale, n_lo, n_hi, act, tops, first, second)
    unsolved = np.flatnonzero((first == 0) & (scale > 0))
    first[unsolved], second[unsolved] = 1.0, scale[unsolved]  # as TNN's factor: suspects() lists what to recheck
    return first, second, unsolved
