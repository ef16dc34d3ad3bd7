"""numba pooling kernels (NCHW) over items [lo, hi) of N*C, split by _threads.parallel_for.

Window rules mirror torch's CPU kernels exactly.
"""

from __future__ import annotations

import numpy as np
from numba import njit


# Row-at-a-time loops over range() counters and separate unit-stride / strided slices, so numba vectorises
# them (see the note in _conv_kernels.py).
@njit(nogil=True, cache=True, inline="always")
def _max_into(dst, src_row, lo, hi, step, off):
    """dst[k] = max(dst[k], src_row[(lo + k)*step + off]), NaN winning as in torch."""
    if step == 1:
        s1 = src_row[lo + off:hi + off]
        for k in range(hi - lo):
            v = s1[k]
            if v > dst[k] or v != v:
                dst[k] = v
    else:
        s2 = src_row[lo * step + off:(hi - 1) * step + off + 1:step]
        for k in range(hi - lo):
            v = s2[k]
            if v > dst[k] or v != v:
                dst[k] = v


@njit(nogil=True, cache=True, inline="always")
def _add_into(dst, src_row, lo, hi, step, off):
    if step == 1:
        s1 = src_row[lo + off:hi + off]
        for k in range(hi - lo):
            dst[k] += s1[k]
    else:
        s2 = src_row[lo * step + off:(hi - 1) * step + off + 1:step]
        for k in range(hi - lo):
            dst[k] += s2[k]


@njit(nogil=True, cache=True, inline="always")
def _cols(off, step, n, count):
    """[lo, hi) of output columns o whose source o*step + off lies in [0, n)."""
    lo = 0 if off >= 0 else (-off + step - 1) // step
    hi = 0 if n - off <= 0 else (n - off + step - 1) // step
    lo = min(lo, count)
    return lo, max(min(hi, count), lo)


@njit(nogil=True, cache=True)
def max_pool(x, out, kh, kw, sh, sw, dh, dw, pt, pl, lo, hi):
    c_n, h_n, w_n = x.shape[1], x.shape[2], x.shape[3]
    oh_n, ow_n = out.shape[2], out.shape[3]
    for nc in range(lo, hi):
        n, c = nc // c_n, nc % c_n
        for oh in range(oh_n):
            row = out[n, c, oh]
            row[:] = -np.inf
            for i in range(kh):
                ih = oh * sh - pt + i * dh
                if ih < 0 or ih >= h_n:
                    continue
                xrow = x[n, c, ih]
                for j in range(kw):
                    off = j * dw - pl
                    c_lo, c_hi = _cols(off, sw, w_n, ow_n)
                    _max_into(row[c_lo:c_hi], xrow, c_lo, c_hi, sw, off)


@njit(nogil=True, cache=True)
def avg_pool(x, out, kh, kw, sh, sw, pt, pl, pb, pr, count_include_pad, divisor, lo, hi):
    """torch avg_pool2d: the padded window is clipped to the pads, then to the input for the sum.

    divisor > 0 overrides; otherwise the window size within the pads (count_include_pad) or within the input.
    """
    c_n, h_n, w_n = x.shape[1], x.shape[2], x.shape[3]
    oh_n, ow_n = out.shape[2], out.shape[3]
    for nc in range(lo, hi):
        n, c = nc // c_n, nc % c_n
        for oh in range(oh_n):
            row = out[n, c, oh]
            row[:] = 0
            h0 = oh * sh - pt
            h1 = min(h0 + kh, h_n + pb)
            ph = h1 - h0
            rows_in = min(h1, h_n) - max(h0, 0)
            for i in range(kh):
                ih = h0 + i
                if ih < 0 or ih >= h_n:
                    continue
                xrow = x[n, c, ih]
                for j in range(kw):
                    off = j - pl
                    c_lo, c_hi = _cols(off, sw, w_n, ow_n)
                    _add_into(row[c_lo:c_hi], xrow, c_lo, c_hi, sw, off)
            for ow in range(ow_n):
                w0 = ow * sw - pl
                w1 = min(w0 + kw, w_n + pr)
                if divisor > 0:
                    d = divisor
                elif count_include_pad:
                    d = ph * (w1 - w0)
                else:
                    d = rows_in * (min(w1, w_n) - max(w0, 0))
                row[ow] = row[ow] / d


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
