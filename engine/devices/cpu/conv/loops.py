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
from numba import carray, njit

from engine.devices.cpu.loops.fused_epilogue import activate_row
from engine.devices.cpu.loops.native import f32_at, open_job, region, team_share

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


@njit(nogil=True, cache=True, inline="always")
def _axpy3(acc, s0, s1, s2, w0, w1, w2):
    """acc += w0*s0 + w1*s1 + w2*s2 over acc's length (three taps in one pass)."""
    for k in range(acc.shape[0]):
        acc[k] += w0 * s0[k] + w1 * s1[k] + w2 * s2[k]


@njit(nogil=True, cache=True, inline="always")
def _axpy1(acc, s0, w0):
    """acc += w0*s0 over acc's length."""
    for k in range(acc.shape[0]):
        acc[k] += w0 * s0[k]


# Output floats a depthwise strip accumulates at once: 8 KB, in L1 with the rows its taps read.
STRIP_FLOATS = 2048
# Taps per pass of a depthwise strip: one pass for a 3x3 kernel, each output written once with nine products.
TAPS = 9


@njit(nogil=True, cache=True, inline="always", fastmath={"contract"})
def _taps9(acc, p, so, wv, t0, b, init):
    """acc[k] = (b if init else acc[k]) + sum over t of wv[t0 + t] * p[so[t0 + t] + k], nine taps in one pass (the
    accumulator stays in registers; the taps padding the last pass carry weight 0 and read zeros)."""
    n = acc.shape[0]
    s0, s1, s2 = p[so[t0]:so[t0] + n], p[so[t0 + 1]:so[t0 + 1] + n], p[so[t0 + 2]:so[t0 + 2] + n]
    s3, s4, s5 = p[so[t0 + 3]:so[t0 + 3] + n], p[so[t0 + 4]:so[t0 + 4] + n], p[so[t0 + 5]:so[t0 + 5] + n]
    s6, s7, s8 = p[so[t0 + 6]:so[t0 + 6] + n], p[so[t0 + 7]:so[t0 + 7] + n], p[so[t0 + 8]:so[t0 + 8] + n]
    w0, w1, w2, w3, w4 = wv[t0], wv[t0 + 1], wv[t0 + 2], wv[t0 + 3], wv[t0 + 4]
    w5, w6, w7, w8 = wv[t0 + 5], wv[t0 + 6], wv[t0 + 7], wv[t0 + 8]
    if init:
        for k in range(n):
            acc[k] = (b + w0 * s0[k] + w1 * s1[k] + w2 * s2[k] + w3 * s3[k] + w4 * s4[k] + w5 * s5[k]
                      + w6 * s6[k] + w7 * s7[k] + w8 * s8[k])
    else:
        for k in range(n):
            acc[k] = (acc[k] + w0 * s0[k] + w1 * s1[k] + w2 * s2[k] + w3 * s3[k] + w4 * s4[k] + w5 * s5[k]
                      + w6 * s6[k] + w7 * s7[k] + w8 * s8[k])


@njit(nogil=True, cache=True)
def _phase_maps(kh, kw, sh, sw, dh, dw):
    """(rmap, cmap, rows, cols): the row / column phase planes some tap reads (padded index mod stride), numbered
    0.. in rmap / cmap, -1 for a phase no tap reads (a 1x1 stride-2 conv reads one of four; a huge stride must not
    allocate stride^2 planes)."""
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
    return rmap, cmap, n_rows, n_cols


@njit(nogil=True, cache=True, inline="always")
def _fill_phases(xc, planes, rmap, cmap, sh, sw, pt, pl, r_lo, r_hi, c_lo, c_hi, wq):
    """planes[rmap[a], cmap[b], r * wq + c] = padded[sh*r + a, sw*c + b] for the padded rows [r_lo, r_hi) and
    columns [c_lo, c_hi) that come from the plane xc (H, W); the zero border is the caller's, written once."""
    for r in range(r_lo, r_hi):
        pr, ra = r // sh, rmap[r % sh]
        if ra < 0:
            continue
        xr = xc[r - pt]
        if sw == 1:  # a contiguous run: a vectorised copy (a strided one is a gather)
            dst, at = planes[ra, 0], _U(pr * wq + c_lo)
            for m in range(c_hi - c_lo):
                dst[at + _U(m)] = xr[_U(c_lo - pl + m)]
            continue
        for cb in range(sw):
            if cmap[cb] < 0:
                continue
            m_lo, m_hi = (c_lo - cb + sw - 1) // sw, (c_hi - cb + sw - 1) // sw
            src = sw * m_lo + cb - pl
            dst, at = planes[ra, cmap[cb]], _U(pr * wq + m_lo)
            for m in range(m_hi - m_lo):
                dst[at + _U(m)] = xr[_U(src + sw * m)]


@njit(nogil=True, cache=True, fastmath={"contract"})  # the inlined `_taps9` takes its caller's flags
def depthwise(x, w, bias, z, has_z, out, sh, sw, dh, dw, pt, pl, act, p0, p1, p2, lo, hi):
    """Direct depthwise conv (groups == C == O) of any stride and dilation with bias, optional residual z and the
    activation fused; items [lo, hi) over N * C.

    x (N, C, H, W), w (C, kh, kw), bias (C,), z like out or a dummy, out (N, C, OH, OW); zero padding. Each plane is
    copied zero-padded into its phase planes (`grouped`'s scheme: every tap of every output row reads one
    contiguous run), then strips of output rows (STRIP_FLOATS, in L1) take the taps nine at a time, each output
    held in a register through its nine products (`_taps9`; the columns past OW are computed and dropped). One
    thread, an AVX-512 EPYC, ms against the loops before it (a flat-plane pass per three taps for stride 1, a row
    at a time otherwise): 3x3 32 @112 0.22 / 0.25, 5x5 32 @112 0.45 / 1.78, stride 2 3x3 96 @56 0.17 / 0.53, 7x7
    96 @56 0.30 / 2.74; 3x3 672 @7 0.099 / 0.080 (oneDNN's blocked kernel takes those)."""
    c_n, h_n, w_n = x.shape[1], x.shape[2], x.shape[3]
    oh_n, ow_n = out.shape[2], out.shape[3]
    kh, kw = w.shape[1], w.shape[2]
    hp, wp = (oh_n - 1) * sh + (kh - 1) * dh + 1, (ow_n - 1) * sw + (kw - 1) * dw + 1
    hq, wq = (hp + sh - 1) // sh, (wp + sw - 1) // sw
    size = hq * wq + wq  # the slack keeps the last taps' reads of dropped columns in bounds
    rmap, cmap, n_rows, n_cols = _phase_maps(kh, kw, sh, sw, dh, dw)
    rows = max(1, min(oh_n, STRIP_FLOATS // wq))
    zeros = n_rows * n_cols * size  # then a strip's worth of zeros, which the taps padding a pass of nine read
    flat = np.zeros(zeros + rows * wq, x.dtype)  # once: every item rewrites the planes' interior, the rest stays 0
    planes = flat[:zeros].reshape((n_rows, n_cols, size))
    taps = kh * kw
    n_t = (taps + TAPS - 1) // TAPS * TAPS
    offs = np.zeros(n_t, np.int64)  # tap t's offset into `flat` at strip row 0
    for i in range(kh):
        for j in range(kw):
            ra, ca = rmap[(i * dh) % sh], cmap[(j * dw) % sw]
            offs[i * kw + j] = (ra * n_cols + ca) * size + ((i * dh) // sh) * wq + (j * dw) // sw
    wv = np.zeros(n_t, w.dtype)
    so = np.full(n_t, zeros, np.int64)  # the padding taps: weight 0 times 0 (times a real input's inf would be NaN)
    acc = np.empty(rows * wq, x.dtype)
    r_lo, r_hi = max(pt, 0), min(hp, h_n + pt)  # padded rows [r_lo, r_hi) and columns [c_lo, c_hi) come from x
    c_lo, c_hi = max(pl, 0), min(wp, w_n + pl)
    for nc in range(lo, hi):
        n, c = nc // c_n, nc % c_n
        _fill_phases(x[n, c], planes, rmap, cmap, sh, sw, pt, pl, r_lo, r_hi, c_lo, c_hi, wq)
        for i in range(kh):
            for j in range(kw):
                wv[i * kw + j] = w[c, i, j]
        for r0 in range(0, oh_n, rows):
            r1 = min(oh_n, r0 + rows)
            a = acc[:(r1 - r0) * wq]
            for t in range(taps):
                so[t] = offs[t] + r0 * wq
            for t0 in range(0, n_t, TAPS):
                _taps9(a, flat, so, wv, t0, bias[c], t0 == 0)
            _store_rows(a, wq, out[n, c], z, n, c, r0, r1, has_z, act, p0, p1, p2)


@njit(nogil=True, cache=True, inline="always")
def _store_rows(acc, width, oc, z, n, c, r0, r1, has_z, act, p0, p1, p2):
    """oc[r0:r1] = act(acc + z[n, c, r0:r1]) from a flat accumulator of rows `width` wide (the columns past oc's
    are dropped)."""
    ow_n = oc.shape[1]
    for oh in range(r0, r1):  # a copy (plus z) per row, then the activation's own loop: both vectorise
        at, row = _U((oh - r0) * width), oc[oh]
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

    A group's zero-padded input planes are split by row and column phase as `depthwise`'s
    (planes[k, a, b, r, c] = padded[k, sh*r + a, sw*c + b], `_fill_phases`), so every tap of every output row reads one
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
    rmap, cmap, n_rows, n_cols = _phase_maps(kh, kw, sh, sw, dh, dw)
    planes = np.zeros((a_n, n_rows, n_cols, size), x.dtype)  # once: every item rewrites the same interior
    acc = np.empty(span, x.dtype)
    r_lo, r_hi = max(pt, 0), min(hp, h_n + pt)  # padded rows [r_lo, r_hi) and columns [c_lo, c_hi) come from x
    c_lo, c_hi = max(pl, 0), min(wp, w_n + pl)
    for item in range(lo, hi):
        n, g = item // g_n, item % g_n
        for k in range(a_n):
            _fill_phases(x[n, g * a_n + k], planes[k], rmap, cmap, sh, sw, pt, pl, r_lo, r_hi, c_lo, c_hi, wq)
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
                        else:  # one tap alone (zero-weight partners would make an inf input's product NaN)
                            _axpy1(acc, p0_[o0:o0 + span], w0)
                            t = 1
                        j += t
            _store_rows(acc, wq, out[n, o], z, n, o, 0, oh_n, has_z, act, p0, p1, p2)


# `job` (int64 words) of `direct_team`: OpenMP's two getters (open_job); which loop (DIRECT_DEPTHWISE or
# DIRECT_GROUPED) and its items; x's N, C, H, W and out's O, OH, OW; the weights' dims (C or O, C / groups, kh,
# kw: depthwise ones are (C, kh, kw)); the float32 x, weights, bias, z and out addresses (z: any float32 4-D array
# of 1 element where there is none); whether there is a z; sh, sw, dh, dw, pt, pl; the activation code and its three
# float32 parameters' bits.
DIRECT_DEPTHWISE, DIRECT_GROUPED = 0, 1
(DT_LOOP, DT_ITEMS, DT_N, DT_C, DT_H, DT_W, DT_O, DT_OH, DT_OW, DT_W0, DT_W1, DT_KH, DT_KW, DT_X, DT_WT, DT_BIAS,
 DT_Z, DT_OUT, DT_HAS_Z, DT_SH, DT_SW, DT_DH, DT_DW, DT_PT, DT_PL, DT_ACT, DT_P0, DT_P1, DT_P2, DT_LEN) = range(2, 32)


@njit(nogil=True, cache=True, inline="always")
def _bits_f32(word):
    return np.int32(word).view(np.float32)


@region
def direct_team(data):
    """One OpenMP thread's share of the items of a `depthwise` or `grouped` call (see DT_*), as parallel_for
    splits them; called outside a region, all of them (a native program's call)."""
    job, t, team = open_job(data, DT_LEN)
    items = job[DT_ITEMS]
    lo, hi = team_share(items, t, team)
    if lo >= hi:
        return
    n, o, oh, ow = job[DT_N], job[DT_O], job[DT_OH], job[DT_OW]
    x = carray(f32_at(job[DT_X]), (n, job[DT_C], job[DT_H], job[DT_W]))
    out = carray(f32_at(job[DT_OUT]), (n, o, oh, ow))
    has_z = job[DT_HAS_Z] != 0
    z = carray(f32_at(job[DT_Z]), (n, o, oh, ow) if has_z else (1, 1, 1, 1))
    bias = carray(f32_at(job[DT_BIAS]), (o,))
    p0, p1, p2 = _bits_f32(job[DT_P0]), _bits_f32(job[DT_P1]), _bits_f32(job[DT_P2])
    geo = (job[DT_SH], job[DT_SW], job[DT_DH], job[DT_DW], job[DT_PT], job[DT_PL])
    if job[DT_LOOP] == DIRECT_DEPTHWISE:
        w = carray(f32_at(job[DT_WT]), (job[DT_W0], job[DT_KH], job[DT_KW]))
        depthwise(x, w, bias, z, has_z, out, *geo, job[DT_ACT], p0, p1, p2, lo, hi)
    else:
        w = carray(f32_at(job[DT_WT]), (job[DT_W0], job[DT_W1], job[DT_KH], job[DT_KW]))
        grouped(x, w, bias, z, has_z, out, *geo, job[DT_ACT], p0, p1, p2, lo, hi)
