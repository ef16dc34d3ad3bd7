"""numba pooling kernels (NCHW) over items [lo, hi) of N*C, split by _threads.parallel_for.

Window rules mirror torch's CPU kernels exactly.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def max_pool(x, out, kh, kw, sh, sw, dh, dw, pt, pl, lo, hi):
    c_n, h_n, w_n = x.shape[1], x.shape[2], x.shape[3]
    oh_n, ow_n = out.shape[2], out.shape[3]
    for nc in range(lo, hi):
        n, c = nc // c_n, nc % c_n
        for oh in range(oh_n):
            for ow in range(ow_n):
                m = -np.inf
                for i in range(kh):
                    ih = oh * sh - pt + i * dh
                    if ih < 0 or ih >= h_n:
                        continue
                    for j in range(kw):
                        iw = ow * sw - pl + j * dw
                        if 0 <= iw < w_n:
                            v = x[n, c, ih, iw]
                            if v > m or v != v:  # NaN propagates, as in torch
                                m = v
                out[n, c, oh, ow] = m


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
            h0 = oh * sh - pt
            h1 = min(h0 + kh, h_n + pb)
            ph = h1 - h0
            h0, h1 = max(h0, 0), min(h1, h_n)
            for ow in range(ow_n):
                w0 = ow * sw - pl
                w1 = min(w0 + kw, w_n + pr)
                pw = w1 - w0
                w0, w1 = max(w0, 0), min(w1, w_n)
                s = 0.0
                for ih in range(h0, h1):
                    for iw in range(w0, w1):
                        s += x[n, c, ih, iw]
                if divisor > 0:
                    d = divisor
                elif count_include_pad:
                    d = ph * pw
                else:
                    d = (h1 - h0) * (w1 - w0)
                out[n, c, oh, ow] = s / d


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
