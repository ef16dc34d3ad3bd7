"""numba loops of the NHWC int8 ops, bit-exact with the references (engine/ops/quant.py) like loops/quant.py,
whose float2int8 (`f2i8`) and conv requantization (`requantize_one`) they share. Channels are the innermost
axis, so the per-channel loops run over contiguous memory. Work is split over items [lo, hi) by
threads.parallel_for (items are rows: (n, y) pairs or pixels, as each loop says).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from engine.devices.cpu.loops.quant import f2i8, requantize_one

ZERO = np.float32(0.0)


@njit(nogil=True, cache=True)
def quantize(x, scale, out, lo, hi):
    """x (N, C, H, W) float32 -> out (N, H, W, C) int8, float2int8(x / scale[c]); items (n, y)."""
    c_n, h_n, w_n = x.shape[1], x.shape[2], x.shape[3]
    for item in range(lo, hi):
        n, y = item // h_n, item % h_n
        for c in range(c_n):
            s = scale[c]
            for xx in range(w_n):
                out[n, y, xx, c] = f2i8(x[n, c, y, xx] / s) if s != ZERO else np.int8(0)


@njit(nogil=True, cache=True)
def dequantize(x, scale, out, lo, hi):
    """x (N, H, W, C) int8 -> out (N, C, H, W) float32, scale[c] * x; items (n, y)."""
    h_n, w_n, c_n = x.shape[1], x.shape[2], x.shape[3]
    for item in range(lo, hi):
        n, y = item // h_n, item % h_n
        for c in range(c_n):
            s = scale[c]
            for xx in range(w_n):
                out[n, c, y, xx] = s * np.float32(x[n, y, xx, c])


@njit(nogil=True, cache=True)
def add(a, b, sa, sb, so, out, lo, hi):
    """(sa * a + sb * b) / so per channel over (P, C) pixels; items are pixels."""
    c_n = a.shape[1]
    for p in range(lo, hi):
        for c in range(c_n):
            out[p, c] = f2i8((sa[c] * np.float32(a[p, c]) + sb[c] * np.float32(b[p, c])) / so[c])


@njit(nogil=True, cache=True)
def pool(x, out, kh, kw, sh, sw, ph, pw, is_max, lo, hi):
    """TNN's naive int8 pooling on (N, H, W, C): max starting at -127, or an int32 sum divided with truncation;
    items (n, oy)."""
    h_n, w_n, c_n = x.shape[1], x.shape[2], x.shape[3]
    oh_n, ow_n = out.shape[1], out.shape[2]
    acc = np.empty(c_n, np.int32)
    for item in range(lo, hi):
        n, i = item // oh_n, item % oh_n
        h0, h1 = max(i * sh - ph, 0), min(i * sh - ph + kh, h_n)
        for j in range(ow_n):
            w0, w1 = max(j * sw - pw, 0), min(j * sw - pw + kw, w_n)
            acc[:] = -127 if is_max else 0
            for y in range(h0, h1):
                for z in range(w0, w1):
                    for c in range(c_n):
                        v = np.int32(x[n, y, z, c])
                        if is_max:
                            acc[c] = max(acc[c], v)
                        else:
                            acc[c] += v
            count = max((h1 - h0) * (w1 - w0), 1)
            for c in range(c_n):
                if is_max:
                    out[n, i, j, c] = np.int8(acc[c])
                else:
                    q = abs(acc[c]) // count
                    out[n, i, j, c] = np.int8(q if acc[c] >= 0 else -q)


@njit(nogil=True, cache=True)
def concat_part(x, factor, s_out, requant, at, out, lo, hi):
    """Copies (P, Ci) x into out[:, at:at + Ci] (P, C), requantizing by factor / s_out when asked; items pixels."""
    c_n = x.shape[1]
    for p in range(lo, hi):
        for c in range(c_n):
            out[p, at + c] = f2i8(np.float32(x[p, c]) * factor / s_out) if requant else x[p, c]


@njit(nogil=True, cache=True)
def epilogue(acc, bias, scale, z, add_scale, relu6_max, act, fusion, out, lo, hi):
    """acc (P, O) int32 sums without bias -> out (P, O) int8 as qconv_reference; z (P, O) int8 when fused;
    items are pixels."""
    o_n = acc.shape[1]
    for p in range(lo, hi):
        for o in range(o_n):
            zv = z[p, o] if fusion else np.int8(0)
            out[p, o] = requantize_one(acc[p, o] + bias[o], scale[o], zv, add_scale[o], relu6_max[o], act, fusion)


@njit(nogil=True, cache=True)
def conv_channels(x, w, bias, scale, z, add_scale, relu6_max, act, fusion, chans, geo, out, lo, hi):
    """Direct int8 convolution of the output channels `chans` only, on NHWC: x (N, H, W, C), w (O, kh, kw, C/g),
    out (N, OH, OW, O), z like out when fused; geo = (sh, sw, dh, dw, pt, pl, groups). Exact int32 sums and the
    reference's requantization; items (n, oy)."""
    h_n, w_n = x.shape[1], x.shape[2]
    o_n, kh, kw, icg = w.shape
    oh_n, ow_n = out.shape[1], out.shape[2]
    sh, sw, dh, dw, pt, pl, groups = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6]
    opg = o_n // groups
    for item in range(lo, hi):
        n, oy = item // oh_n, item % oh_n
        for ox in range(ow_n):
            for k in range(chans.shape[0]):
                o = chans[k]
                c0 = (o // opg) * icg
                acc = np.int32(bias[o])
                for i in range(kh):
                    iy = oy * sh - pt + i * dh
                    if iy < 0 or iy >= h_n:
                        continue
                    for j in range(kw):
                        ix = ox * sw - pl + j * dw
                        if ix < 0 or ix >= w_n:
                            continue
                        for c in range(icg):
                            acc += np.int32(w[o, i, j, c]) * np.int32(x[n, iy, ix, c0 + c])
                zv = z[n, oy, ox, o] if fusion else np.int8(0)
                out[n, oy, ox, o] = requantize_one(acc, scale[o], zv, add_scale[o], relu6_max[o], act, fusion)
