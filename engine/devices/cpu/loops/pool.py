"""numba pooling kernels (NCHW) over items [lo, hi) of N*C, split by threads.parallel_for.

Window rules mirror torch's CPU kernels exactly.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from engine.devices.cpu.loops.native import bool_at, f32_at, open_job, region

_U = np.uint64  # loop indices numba does not wrap around (see _row_max)


@njit(nogil=True, cache=True, fastmath={"reassoc", "nsz", "contract"})
def not_finite(x):
    """Whether the flat float array x holds a NaN or an infinity: x * 0 sums to NaN exactly then (no nnan or ninf
    flag, so LLVM may not fold it; reassoc lets it vectorise): 0.07-0.09 ns an element on an AVX2 EPYC, where an
    or-reduction of x != x took 0.13-0.16. oneDNN's max pooling lets a NaN go (its vector max keeps whichever
    operand the order gives), so its callers run the NaN-propagating numba loop on such inputs."""
    s = x.dtype.type(0)
    for j in range(x.shape[0]):
        s += x[j] * x.dtype.type(0)
    return s != s


# `job` (int64 words) of `not_finite_team`: OpenMP's two getters (open_job), the float32 input's address and
# length, the flags' address and count (the input's shares, one flag each).
NF_X, NF_N, NF_FLAGS, NF_PARTS, NF_LEN = 2, 3, 4, 5, 6


@region
def not_finite_team(data):
    """not_finite over the team: the input in NF_PARTS shares, thread t reading shares t, t + team, ... and writing
    each one's answer at its flag, so that every share is read whatever the team's size."""
    job, t, team = open_job(data, NF_LEN)
    n, parts = job[NF_N], job[NF_PARTS]
    flags = carray(bool_at(job[NF_FLAGS]), (parts,))
    for s in range(t, parts, team):
        lo, hi = n * s // parts, n * (s + 1) // parts
        flags[s] = not_finite(carray(f32_at(job[NF_X] + 4 * lo), (hi - lo,)))


@njit(nogil=True, cache=True, inline="always")
def _mx(m, v):
    """max(m, v) with NaN winning as in torch; branch-free (`|`, not `or`) so the row loops vectorise."""
    return v if (v > m) | (v != v) else m


@njit(nogil=True, cache=True)
def global_max(xi, out, lo, hi):
    """out[p] = the max of float32 row p of x (planes, H*W), given as its int32 bits xi, for rows [lo, hi); a NaN
    wins as in torch (either sign). Each value maps to an order-preserving int (a negative float's magnitude bits
    flipped; a NaN first to the positive NaN, above +inf) and the max is taken over ints, which LLVM vectorises,
    where a float max with NaN checks stays a chain of scalar compares (one thread, 512 rows of 196: 13 us,
    numpy's 38; 2048 of 49: 12 us, numpy's 94; 53 us for lanes of running float maxima)."""
    q = xi.shape[1]
    low, keep, inf = np.int32(31), np.int32(0x7FFFFFFF), np.int32(0x7F800000)
    for p in range(lo, hi):
        r = xi[p]
        m = np.int32(-0x7FFFFFFF - 1)  # below every mapped value (the caller keeps empty rows away)
        for k in range(q):
            v = r[k]
            a = np.int32(v & keep)
            v = a if a > inf else v  # a NaN of either sign: the positive one
            w = np.int32(v ^ np.int32(np.int32(v >> low) & keep))
            m = w if w > m else m
        out[p] = np.int32(m ^ np.int32(np.int32(m >> low) & keep)).view(np.float32)


@njit(nogil=True, cache=True)
def _column_max(x, n, c, vv, ih0, nrows, dh):
    """vv = max over input rows ih0, ih0+dh, ... (nrows of them) of plane (n, c); -inf when there are none."""
    if nrows <= 0:
        vv[:] = -np.inf
        return
    r0 = x[n, c, ih0]
    for k in range(vv.size):
        vv[k] = r0[k]
    for i in range(1, nrows):
        r = x[n, c, ih0 + i * dh]
        for k in range(vv.size):
            vv[k] = _mx(vv[k], r[k])


@njit(nogil=True, cache=True, inline="always")
def _row_max(v, row, kw, sw, dw):
    """row[o] = max over taps j of v[o*sw + j*dw]; the usual geometries get loops with constant taps, indexed
    unsigned (a signed index is wrapped around when negative, which kept LLVM from vectorising the strided reads:
    2x2 s2 over 128 @56, one thread, 350 -> 90 us)."""
    if kw == 3 and dw == 1 and sw == 2:
        for o in range(row.size):
            b = _U(2 * o)
            row[o] = _mx(_mx(v[b], v[b + _U(1)]), v[b + _U(2)])
    elif kw == 3 and dw == 1 and sw == 1:
        for o in range(row.size):
            b = _U(o)
            row[o] = _mx(_mx(v[b], v[b + _U(1)]), v[b + _U(2)])
    elif kw == 2 and dw == 1 and sw == 2:
        for o in range(row.size):
            b = _U(2 * o)
            row[o] = _mx(v[b], v[b + _U(1)])
    else:
        for o in range(row.size):
            b = o * sw
            m = v[b]
            for j in range(1, kw):
                m = _mx(m, v[b + j * dw])
            row[o] = m


@njit(nogil=True, cache=True)
def max_pool(x, out, kh, kw, sh, sw, dh, dw, pt, pl, lo, hi):
    """Separable max: per output row, the max of its kh input rows into a -inf padded scratch row (unit
    stride), then the kw-tap max along it. 6 vectorised passes per output row instead of 9 strided ones;
    the 3-row case is written out inline (through a helper call numba vectorised it half as well)."""
    c_n, h_n, w_n = x.shape[1], x.shape[2], x.shape[3]
    oh_n, ow_n = out.shape[2], out.shape[3]
    if kh == kw == sh == sw == 2 and dh == dw == 1 and pt == pl == 0 and 2 * oh_n <= h_n and 2 * ow_n <= w_n:
        _max_pool_2x2(x, out, lo, hi)
        return
    span = (ow_n - 1) * sw + (kw - 1) * dw + 1
    v = np.full(max(span, pl + w_n), -np.inf, x.dtype)  # one small row per call: the pads stay -inf
    vv = v[pl:pl + w_n]
    for nc in range(lo, hi):
        n, c = nc // c_n, nc % c_n
        for oh in range(oh_n):
            top = oh * sh - pt
            i0 = 0 if top >= 0 else (-top + dh - 1) // dh
            i1 = min(kh, (h_n - 1 - top) // dh + 1)
            if i1 - i0 == 3:
                r0, r1, r2 = x[n, c, top + i0 * dh], x[n, c, top + (i0 + 1) * dh], x[n, c, top + (i0 + 2) * dh]
                for k in range(w_n):
                    vv[k] = _mx(_mx(r0[k], r1[k]), r2[k])
            else:
                _column_max(x, n, c, vv, top + i0 * dh, i1 - i0, dh)
            _row_max(v, out[n, c, oh], kw, sw, dw)


@njit(nogil=True, cache=True)
def _max_pool_2x2(x, out, lo, hi):
    """2x2 stride-2 windows all inside the input (no pads, no ceil_mode overhang): each output row in one pass over
    its two input rows (the scratch row of `max_pool` costs two more; 128 @56, one thread: 90 -> 60 us)."""
    c_n = x.shape[1]
    for nc in range(lo, hi):
        n, c = nc // c_n, nc % c_n
        for oh in range(out.shape[2]):
            r0, r1, row = x[n, c, 2 * oh], x[n, c, 2 * oh + 1], out[n, c, oh]
            for o in range(row.size):
                b = _U(2 * o)
                row[o] = _mx(_mx(r0[b], r0[b + _U(1)]), _mx(r1[b], r1[b + _U(1)]))


@njit(nogil=True, cache=True, inline="always")
def _row_sum(v, row, kw, sw):
    """row[o] = the sum over taps j of v[o*sw + j], in tap order; the usual geometries get loops with constant
    taps (unsigned indices, as _row_max)."""
    if kw == 2 and sw == 2:
        for o in range(row.size):
            b = _U(2 * o)
            row[o] = v[b] + v[b + _U(1)]
    elif kw == 3 and sw == 1:
        for o in range(row.size):
            b = _U(o)
            row[o] = v[b] + v[b + _U(1)] + v[b + _U(2)]
    elif kw == 3 and sw == 2:
        for o in range(row.size):
            b = _U(2 * o)
            row[o] = v[b] + v[b + _U(1)] + v[b + _U(2)]
    else:
        for o in range(row.size):
            row[o] = v[_U(o * sw)]
        for j in range(1, kw):
            s = v[j:]
            for o in range(row.size):
                row[o] += s[_U(o * sw)]


@njit(nogil=True, cache=True)
def avg_divisors(h_n, w_n, oh_n, ow_n, kh, kw, sh, sw, pt, pl, pb, pr, count_include_pad, divisor):
    """(oh, ow) divisors of torch's avg_pool2d: the padded window clipped to the pads, then to the input for the
    count (divisor > 0 overrides; count_include_pad counts the window within the pads)."""
    d = np.empty((oh_n, ow_n), np.float32)
    for oh in range(oh_n):
        h0 = oh * sh - pt
        h1 = min(h0 + kh, h_n + pb)
        rows = h1 - h0 if count_include_pad else min(h1, h_n) - max(h0, 0)
        for ow in range(ow_n):
            w0 = ow * sw - pl
            w1 = min(w0 + kw, w_n + pr)
            cols = w1 - w0 if count_include_pad else min(w1, w_n) - max(w0, 0)
            d[oh, ow] = divisor if divisor > 0 else rows * cols
    return d


@njit(nogil=True, cache=True, error_model="numpy")  # a zero divisor (a window all padding) gives NaN, as numpy's
def avg_pool(x, out, kh, kw, sh, sw, pt, pl, d, lo, hi):
    """torch avg_pool2d over planes [lo, hi), `d` the divisors (avg_divisors). Separable as max_pool: per output
    row, the sum of its input rows (clipped to the input) into a zero-padded scratch row, then the kw-tap sum
    along it and the division: vectorised passes over whole rows, where adding each tap's shifted row into the
    output cost a slice per tap and a scalar divide per output (AvgPool 3x3 s1 p1 192 @28: 0.99 ms)."""
    c_n, h_n, w_n = x.shape[1], x.shape[2], x.shape[3]
    oh_n, ow_n = out.shape[2], out.shape[3]
    span = (ow_n - 1) * sw + kw
    v = np.zeros(max(span, pl + w_n), x.dtype)  # one small row per call: the pads stay zero
    vv = v[pl:pl + w_n]
    for nc in range(lo, hi):
        n, c = nc // c_n, nc % c_n
        for oh in range(oh_n):
            a = max(oh * sh - pt, 0)
            b = min(oh * sh - pt + kh, h_n)
            if b <= a:
                vv[:] = 0
            elif b - a == 3:
                r0, r1, r2 = x[n, c, a], x[n, c, a + 1], x[n, c, a + 2]
                for k in range(w_n):
                    vv[k] = r0[k] + r1[k] + r2[k]
            else:
                r0 = x[n, c, a]
                for k in range(w_n):
                    vv[k] = r0[k]
                for ih in range(a + 1, b):
                    r = x[n, c, ih]
                    for k in range(w_n):
                        vv[k] += r[k]
            row = out[n, c, oh]
            _row_sum(v, row, kw, sw)
            dr = d[oh]
            for o in range(ow_n):
                row[o] = row[o] / dr[o]


@njit(nogil=True, cache=True)
def adaptive_pool(x, out, is_max, lo, hi):
    """Bins [floor(i*in/out), ceil((i+1)*in/out)) per axis, averaged or maxed."""
    c_n, h_n, w_n = x.shape[1], x.shape[2], x.shape[3]
    oh_n, ow_n = out.shape[2], out.shape[3]
    for nc in range(lo, hi):
        n, c = nc // c_n, nc % c_n
        for oh in range(oh_n):
            h0 = (oh * h_n) // oh_n
            h1 = ((oh + 1) * h_n + oh_n - 1) // oh_n
            for ow in range(ow_n):
                w0 = (ow * w_n) // ow_n
                w1 = ((ow + 1) * w_n + ow_n - 1) // ow_n
                if is_max:
                    m = -np.inf
                    for ih in range(h0, h1):
                        for iw in range(w0, w1):
                            v = x[n, c, ih, iw]
                            if v > m or v != v:
                                m = v
                    out[n, c, oh, ow] = m
                else:
                    s = 0.0
                    for ih in range(h0, h1):
                        for iw in range(w0, w1):
                            s += x[n, c, ih, iw]
                    out[n, c, oh, ow] = s / ((h1 - h0) * (w1 - w0))
