"""numba kernels behind the direct Conv / ConvTranspose paths: im2col, col2im, depthwise and grouped (with the
fused epilogue of loops/fused_epilogue.py inlined).

Every function is compiled lazily on first call (per dtype) and cached on disk, and releases the GIL. The
kernels work on items [lo, hi) of their outer axis (channels, or N*C) so engine.devices.cpu.threads.parallel_for can
split them over threads. They take one image (no batch axis) unless said otherwise, so the caller can tile
and loop without slicing copies.

Pad modes are small ints: 0 zeros, 1 reflect, 2 replicate, 3 circular (the Conv `pad_mode` param).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from engine.devices.cpu.loops.fused_epilogue import activate_row

# Flat-buffer indices built from a row offset (r * width + k) are cast to this unsigned type in the copy and store
# loops: numba wraps a negative signed index around, and that check kept LLVM from vectorising them. A 65x65 plane
# copied into its padded buffer: 0.96 -> 0.11 ns an element (14x14: 1.1 -> 0.41, 7x7: 1.5 -> 0.83).
_U = np.uint64

PAD_MODES = {"zeros": 0, "constant": 0, "reflect": 1, "replicate": 2, "edge": 2, "circular": 3}


@njit(nogil=True, cache=True, inline="always")
def _src(idx, n, mode):
    """Source index along an axis of length n for a padded index, or -1 when it reads a zero pad."""
    if 0 <= idx < n:
        return idx
    if mode == 0:
        return -1
    if mode == 1:
        idx = -idx if idx < 0 else 2 * (n - 1) - idx
        return min(max(idx, 0), n - 1)
    if mode == 2:
        return 0 if idx < 0 else n - 1
    return idx % n


@njit(nogil=True, cache=True, inline="always")
def _valid_range(off, step, n, count):
    """[lo, hi) of output positions o in [0, count) whose source o*step + off lies in [0, n)."""
    lo = 0 if off >= 0 else (-off + step - 1) // step
    hi = 0 if n - off <= 0 else (n - off + step - 1) // step
    return min(lo, count), max(min(hi, count), min(lo, count))


# Inner loops index slices with range() counters only: numba cannot prove `k + off` >= 0 and adds a
# negative-index wraparound check that stops vectorisation (measured 27x slower on a row axpy). Unit-stride
# and strided slices get separate variables: unifying them types both as layout 'A', which is 5x slower again.
@njit(nogil=True, cache=True, inline="always")
def _axpy(dst, src_row, lo, hi, step, off, wv):
    """dst[k] += wv * src_row[(lo + k)*step + off] for k < hi - lo."""
    if step == 1:
        s1 = src_row[lo + off:hi + off]
        for k in range(hi - lo):
            dst[k] += wv * s1[k]
    else:
        s2 = src_row[lo * step + off:(hi - 1) * step + off + 1:step]
        for k in range(hi - lo):
            dst[k] += wv * s2[k]


@njit(nogil=True, cache=True, inline="always")
def _gather(dst, src_row, lo, hi, step, off):
    """dst[k] = src_row[(lo + k)*step + off] for k < hi - lo."""
    if step == 1:
        s1 = src_row[lo + off:hi + off]
        for k in range(hi - lo):
            dst[k] = s1[k]
    else:
        s2 = src_row[lo * step + off:(hi - 1) * step + off + 1:step]
        for k in range(hi - lo):
            dst[k] = s2[k]


@njit(nogil=True, cache=True, inline="always")
def _scatter_add(dst_row, src, lo, hi, step, off):
    """dst_row[(lo + k)*step + off] += src[k] for k < hi - lo."""
    if step == 1:
        d1 = dst_row[lo + off:hi + off]
        for k in range(hi - lo):
            d1[k] += src[k]
    else:
        d2 = dst_row[lo * step + off:(hi - 1) * step + off + 1:step]
        for k in range(hi - lo):
            d2[k] += src[k]


@njit(nogil=True, cache=True)
def im2col(x, cols, oh0, rows, ow_n, kh, kw, sh, sw, dh, dw, pt, pl, mode, lo, hi):
    """cols[(c, i, j), t*ow_n + ow] = padded x[c, (oh0+t)*sh - pt + i*dh, ow*sw - pl + j*dw] for t < rows.

    x is (C, H, W) (one image, one group's channels, any strides); cols is a C-contiguous 2-D buffer with
    at least C*kh*kw rows and rows*ow_n columns.
    """
    h_n, w_n = x.shape[1], x.shape[2]
    for c in range(lo, hi):
        for i in range(kh):
            for j in range(kw):
                crow = cols[(c * kh + i) * kw + j]
                woff = j * dw - pl
                w_lo, w_hi = _valid_range(woff, sw, w_n, ow_n)
                for t in range(rows):
                    dst = crow[t * ow_n:(t + 1) * ow_n]
                    ih = _src((oh0 + t) * sh - pt + i * dh, h_n, mode)
                    if ih < 0:
                        dst[:] = 0
                    elif mode == 0:
                        dst[:w_lo] = 0
                        _gather(dst[w_lo:w_hi], x[c, ih], w_lo, w_hi, sw, woff)
                        dst[w_hi:] = 0
                    else:
                        for ow in range(ow_n):
                            dst[ow] = x[c, ih, _src(ow * sw + woff, w_n, mode)]


@njit(nogil=True, cache=True)
def col2im_add(cols, out, h0, rows, w_n, kh, kw, sh, sw, dh, dw, pt, pl, lo, hi):
    """The transposed-conv scatter: out[o, h*sh - pt + i*dh, w*sw - pl + j*dw] += cols[(o, i, j), t*w_n + w].

    h = h0 + t for t < rows; out is (O, OH, OW) for one image and group; positions outside it are cropped
    (that is what the transposed conv's pads do).
    """
    oh_n, ow_n = out.shape[1], out.shape[2]
    for o in range(lo, hi):
        for i in range(kh):
            for j in range(kw):
                crow = cols[(o * kh + i) * kw + j]
                woff = j * dw - pl
                w_lo, w_hi = _valid_range(woff, sw, ow_n, w_n)
                if w_hi <= w_lo:
                    continue
                for t in range(rows):
                    oh = (h0 + t) * sh - pt + i * dh
                    if oh < 0 or oh >= oh_n:
                        continue
                    _scatter_add(out[o, oh], crow[t * w_n + w_lo:t * w_n + w_hi], w_lo, w_hi, sw, woff)


@njit(nogil=True, cache=True)
def depthwise(x, w, bias, z, has_z, out, sh, sw, dh, dw, pt, pl, act, p0, p1, p2, lo, hi):
    """Direct depthwise conv (groups == C == O) with bias, optional residual z and the activation fused.

    x (N, C, H, W), w (C, kh, kw), bias (C,), z like out or a dummy, out (N, C, OH, OW); zero padding.
    Accumulates whole output rows (one vectorised axpy per tap) so each row stays in L1.
    """
    c_n, h_n, w_n = x.shape[1], x.shape[2], x.shape[3]
    oh_n, ow_n = out.shape[2], out.shape[3]
    kh, kw = w.shape[1], w.shape[2]
    for nc in range(lo, hi):
        n, c = nc // c_n, nc % c_n
        b = bias[c]
        for oh in range(oh_n):
            row = out[n, c, oh]
            row[:] = b
            for i in range(kh):
                ih = oh * sh - pt + i * dh
                if ih < 0 or ih >= h_n:
                    continue
                xrow = x[n, c, ih]
                for j in range(kw):
                    wv = w[c, i, j]
                    woff = j * dw - pl
                    w_lo, w_hi = _valid_range(woff, sw, w_n, ow_n)
                    if w_hi <= w_lo:
                        continue
                    _axpy(row[w_lo:w_hi], xrow, w_lo, w_hi, sw, woff, wv)
            if has_z:
                zrow = z[n, c, oh]
                for ow in range(ow_n):
                    row[ow] += zrow[ow]
            activate_row(row, act, p0, p1, p2)


@njit(nogil=True, cache=True, inline="always")
def _axpy3(acc, s0, s1, s2, w0, w1, w2):
    """acc += w0*s0 + w1*s1 + w2*s2 over acc's length (three taps in one pass)."""
    for k in range(acc.shape[0]):
        acc[k] += w0 * s0[k] + w1 * s1[k] + w2 * s2[k]


@njit(nogil=True, cache=True)
def depthwise_s1(x, w, bias, z, has_z, out, dh, dw, pt, pl, act, p0, p1, p2, lo, hi):
    """Stride-1 depthwise conv over a flattened zero-padded plane: per channel, the plane's rows copied into it,
    then one pass per three taps over the whole plane (row width Wp, the Wp - OW extra columns per row are
    computed and dropped), so no map pays a per-row, per-tap overhead. Same arguments as `depthwise`.
    (Strips of rows that keep the accumulator in L1 measured no faster at 256 channels @65 with dilation 12.)
    """
    c_n, h_n, w_n = x.shape[1], x.shape[2], x.shape[3]
    oh_n, ow_n = out.shape[2], out.shape[3]
    kh, kw = w.shape[1], w.shape[2]
    hp, wp = oh_n + (kh - 1) * dh, ow_n + (kw - 1) * dw
    span = oh_n * wp
    plane = np.empty(hp * wp + (kw - 1) * dw, x.dtype)  # the tail keeps the last taps' reads in bounds
    acc = np.empty(span, x.dtype)
    r_lo, r_hi = max(pt, 0), min(hp, h_n + pt)  # padded rows [r_lo, r_hi) come from x
    c_lo, c_hi = max(pl, 0), min(wp, w_n + pl)
    plane[:] = 0  # once: every channel rewrites the same interior, the zero border stays
    for nc in range(lo, hi):
        n, c = nc // c_n, nc % c_n
        xc = x[n, c]
        for r in range(r_lo, r_hi):
            xr = xc[r - pt]
            at = _U(r * wp + c_lo)
            for k in range(c_hi - c_lo):
                plane[at + _U(k)] = xr[_U(c_lo - pl + k)]
        b = bias[c]
        for k in range(span):
            acc[k] = b
        for i in range(kh):
            j = 0
            while j < kw:  # up to three taps per pass: a third of the traffic on acc
                o0 = i * dh * wp + j * dw
                if j + 3 <= kw:
                    _axpy3(acc, plane[o0:o0 + span], plane[o0 + dw:o0 + dw + span],
                           plane[o0 + 2 * dw:o0 + 2 * dw + span], w[c, i, j], w[c, i, j + 1], w[c, i, j + 2])
                    j += 3
                else:
                    zero = w[c, i, j] * 0  # in the weights' dtype: an int 0 would turn the loop into float64
                    _axpy3(acc, plane[o0:o0 + span], plane[o0:o0 + span], plane[o0:o0 + span], w[c, i, j], zero, zero)
                    j += 1
        _store_plane(acc, wp, out[n, c], z, n, c, has_z, act, p0, p1, p2)


@njit(nogil=True, cache=True, inline="always")
def _store_plane(acc, width, oc, z, n, c, has_z, act, p0, p1, p2):
    """oc = act(acc + z[n, c]) from a flat accumulator of rows `width` wide (the columns past oc's are dropped)."""
    oh_n, ow_n = oc.shape
    for oh in range(oh_n):  # a copy (plus z) per row, then the activation's own loop: both vectorise
        at, row = _U(oh * width), oc[oh]
        if has_z:
            zr = z[n, c, oh]
            for ow in range(ow_n):
                row[ow] = acc[at + _U(ow)] + zr[ow]
        else:
            for ow in range(ow_n):
                row[ow] = acc[at + _U(ow)]
        activate_row(row, act, p0, p1, p2)


@njit(nogil=True, cache=True)
def grouped(x, w, bias, z, has_z, out, sh, sw, dh, dw, pt, pl, act, p0, p1, p2, lo, hi):
    """Direct grouped conv of few channels per group (the ones oneDNN has only its gemm-based kernel for), items
    [lo, hi) over N * groups; w (O, C / groups, kh, kw), the other arguments as `depthwise`.

    depthwise_s1's scheme for every stride: a group's zero-padded input planes are split by row and column phase
    (planes[k, a, b, r, c] = padded[k, sh*r + a, sw*c + b]), so every tap of every output row reads one
    contiguous run, and an output channel's whole map accumulates in one flat row of width `wq` (the columns past
    OW are computed and dropped) by one vectorised pass per three taps: a few passes over a small buffer per
    output channel, where im2col ran two calls and a GEMM of a few rows per group (ResNeXt's 3x3 over 4 channels
    a group: 1.9 ms at 128 channels @28)."""
    c_n, h_n, w_n = x.shape[1], x.shape[2], x.shape[3]
    o_n, oh_n, ow_n = out.shape[1], out.shape[2], out.shape[3]
    a_n, kh, kw = w.shape[1], w.shape[2], w.shape[3]
    g_n = c_n // a_n
    b_n = o_n // g_n
    hp, wp = (oh_n - 1) * sh + (kh - 1) * dh + 1, (ow_n - 1) * sw + (kw - 1) * dw + 1
    hq, wq = (hp + sh - 1) // sh, (wp + sw - 1) // sw
    span = oh_n * wq
    size = hq * wq + wq  # the slack keeps the last taps' reads of dropped columns in bounds
    # only the phases some tap reads get a plane (a 1x1 stride-2 conv reads one of four; a huge stride must not
    # allocate stride^2 planes): rmap / cmap give a phase's plane, -1 for none
    rmap, cmap = np.full(sh, -1, np.int64), np.full(sw, -1, np.int64)
    n_rows = n_cols = 0
    for i in range(kh):
        if rmap[(i * dh) % sh] < 0:
            rmap[(i * dh) % sh] = n_rows
            n_rows += 1
    for j in range(kw):
        if cmap[(j * dw) % sw] < 0:
            cmap[(j * dw) % sw] = n_cols
            n_cols += 1
    planes = np.zeros((a_n, n_rows, n_cols, size), x.dtype)  # once: every item rewrites the same interior
    acc = np.empty(span, x.dtype)
    r_lo, r_hi = max(pt, 0), min(hp, h_n + pt)  # padded rows [r_lo, r_hi) and columns [c_lo, c_hi) come from x
    c_lo, c_hi = max(pl, 0), min(wp, w_n + pl)
    for item in range(lo, hi):
        n, g = item // g_n, item % g_n
        for k in range(a_n):
            xc = x[n, g * a_n + k]
            for r in range(r_lo, r_hi):
                pr, ra = r // sh, rmap[r % sh]
                if ra < 0:
                    continue
                xr = xc[r - pt]
                if sw == 1:  # a contiguous run: a vectorised copy (a strided one is a gather)
                    dst, at = planes[k, ra, 0], _U(pr * wq + c_lo)
                    for m in range(c_hi - c_lo):
                        dst[at + _U(m)] = xr[_U(c_lo - pl + m)]
                    continue
                for cb in range(sw):
                    if cmap[cb] < 0:
                        continue
                    m_lo, m_hi = (c_lo - cb + sw - 1) // sw, (c_hi - cb + sw - 1) // sw
                    src = sw * m_lo + cb - pl
                    dst = planes[k, ra, cmap[cb]]
                    at = _U(pr * wq + m_lo)
                    for m in range(m_hi - m_lo):
                        dst[at + _U(m)] = xr[_U(src + sw * m)]
        for ob in range(b_n):
            o = g * b_n + ob
            bo = bias[o]
            for s in range(span):
                acc[s] = bo
            for k in range(a_n):
                for i in range(kh):
                    ri, ra = (i * dh) // sh, rmap[(i * dh) % sh]
                    j = 0
                    while j < kw:  # up to three taps per pass: a third of the traffic on acc
                        t = min(3, kw - j)
                        o0 = ri * wq + (j * dw) // sw
                        p0_ = planes[k, ra, cmap[(j * dw) % sw]]
                        w0 = w[o, k, i, j]
                        if t == 3:
                            o1, o2 = ri * wq + ((j + 1) * dw) // sw, ri * wq + ((j + 2) * dw) // sw
                            p1_ = planes[k, ra, cmap[((j + 1) * dw) % sw]]
                            p2_ = planes[k, ra, cmap[((j + 2) * dw) % sw]]
                            _axpy3(acc, p0_[o0:o0 + span], p1_[o1:o1 + span], p2_[o2:o2 + span], w0,
                                   w[o, k, i, j + 1], w[o, k, i, j + 2])
                        else:
                            zero = w0 * 0  # in the weights' dtype: an int 0 would turn the loop into float64
                            s0 = p0_[o0:o0 + span]
                            _axpy3(acc, s0, s0, s0, w0, zero, zero)
                            t = 1
                        j += t
            _store_plane(acc, wq, out[n, o], z, n, o, has_z, act, p0, p1, p2)
