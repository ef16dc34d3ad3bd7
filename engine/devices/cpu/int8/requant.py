"""Requantization on oneDNN, bit-exact with TNN's: the per-channel factors oneDNN multiplies by.

TNN requantizes an int32 sum N (products plus bias) as float2int8(fl(N * s)): add +-0.5 in float32, clamp to
[-128, 127], truncate. oneDNN's int8 convolution, given the bias as float and s as a per-channel `binary mul`
post-op, computes the same fl(N * s) (N and the bias are integers below 2**24, so their float sum is exact), but
stores it to int8 rounding half to even. The two differ only where fl(N * s) is a tie k + 0.5 (about one channel
in ten of MobileNetV2 has one within its range), and at the float32 quirk fl(0.49999997 + 0.5) = 1.

`tie_free_scales` moves each channel's factor up by a few ulps (s' = s, nextafter(s), ...) until
round_half_even(fl(N * s')) equals TNN's rounding of fl(N * s) for every integer N the layer can produce
(|N| <= 128 * sum|w| + |bias|). Both are monotone step functions of N, so comparing them on windows around
every step (N near (k + 0.5) / s for each int8 boundary k) proves them equal everywhere. Channels left without
such a factor (a tie and a value an ulp below another tie in the same channel: 0.4% of MobileNetV2's) are
recomputed exactly after the primitive (conv.py), or the layer takes the int32 path.
"""

from __future__ import annotations

import numpy as np
from numba import njit

F32 = np.float32
EXACT_LIMIT = 1 << 24  # below this every integer is a float32, so oneDNN's int -> float steps are exact
MAX_STEPS = 8  # ulps tried above s
WINDOW = 2  # N within this of a step's real-valued position: fl() moves a product by far less than one s


def sum_bound(weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Per output channel, the largest |int32 sum + bias| any int8 input can give (inputs in [-128, 127])."""
    w = np.abs(weight.reshape(weight.shape[0], -1).astype(np.int64)).sum(axis=1)
    return w * 128 + np.abs(bias.astype(np.int64).reshape(-1))


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
def agrees(s, c, bound):
    """Whether round_onednn(fl(N * c)) == round_tnn(fl(N * s)) for every integer |N| <= bound (s, c > 0)."""
    inv_s, inv_c = 1.0 / np.float64(s), 1.0 / np.float64(c)
    for k in range(-128, 127):
        t, tc = (k + 0.5) * inv_s, (k + 0.5) * inv_c
        lo, hi = int(np.floor(min(t, tc))) - WINDOW, int(np.ceil(max(t, tc))) + WINDOW
        if hi < -bound or lo > bound:
            continue
        for n in range(max(lo, -bound), min(hi, bound) + 1):
            nf = F32(n)
            if round_tnn(nf * s) != round_onednn(nf * c):
                return False
    return True


@njit(nogil=True, cache=True)
def _search(scale, bound, out, unsolved):
    """out[c] = the first of s, nextafter(s), ... (MAX_STEPS ulps up) that agrees; unsolved[c] when none."""
    for ch in range(scale.shape[0]):
        s = scale[ch]
        out[ch], unsolved[ch] = s, False
        if s == F32(0.0):
            continue  # 0 both ways
        c = s
        for _ in range(MAX_STEPS + 1):
            if agrees(s, c, bound[ch]):
                out[ch] = c
                break
            c = np.nextafter(c, F32(np.inf))
        else:
            unsolved[ch] = True


def tie_free_scales(scale: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(factors for oneDNN's binary-mul post-op, channels no factor makes exact), or None when the layer's sums
    can leave the range where oneDNN's float steps are exact (or a factor is negative or not finite)."""
    scale = np.ascontiguousarray(scale, F32).reshape(-1)
    bound = sum_bound(weight, bias)
    if not np.all(np.isfinite(scale)) or np.any(scale < 0) or np.any(bound >= EXACT_LIMIT):
        return None
    if np.any(scale.astype(np.float64) * bound >= 2.0 ** 31):
        return None
    out, unsolved = np.empty_like(scale), np.zeros(scale.size, np.bool_)
    _search(scale, bound, out, unsolved)
    return out, np.flatnonzero(unsolved)
