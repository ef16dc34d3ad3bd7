"""numba kernels for TNN's int8 ops, bit-exact with the numpy references in quant.py.

Every float step is float32 in the same order as the reference (no fastmath, so no reassociation or fused
multiply-add), and `f2i8` is TNN's float2int8: add +-0.5 in float32, clamp to [-128, 127], truncate.
Work is split over items [lo, hi) by threads.parallel_for; int32 sums live in the caller's workspace.
"""

from __future__ import annotations

import numpy as np
from numba import njit

HALF = np.float32(0.5)
ZERO = np.float32(0.0)


@njit(nogil=True, cache=True, inline="always")
def f2i8(v):
    v = v + (HALF if v >= ZERO else -HALF)
    # the clamp as min/max, not branches, so that loops calling this vectorize (an int8 Add: 2.5x faster)
    return np.int8(np.int32(min(max(v, np.float32(-128.0)), np.float32(127.0))))  # truncates toward zero


@njit(nogil=True, cache=True)
def quantize(x, scale, out, lo, hi):
    """x, out: (n, c, r); scale: (c,). Items are (n, c) rows."""
    c_n = x.shape[1]
    if x.shape[2] == 1:  # one value a row (a classifier's (N, C)): across the channels, not a row per item
        for b, c0, c1 in _item_spans(lo, hi, c_n):
            xr, orow = x[b, :, 0], out[b, :, 0]
            for c in range(c0, c1):
                s = scale[c]
                orow[c] = f2i8(xr[c] / s) if s != ZERO else np.int8(0)
        return
    for item in range(lo, hi):
        b, c = item // c_n, item % c_n
        s = scale[c]
        xr, orow = x[b, c], out[b, c]
        for k in range(xr.shape[0]):
            orow[k] = f2i8(xr[k] / s) if s != ZERO else np.int8(0)


@njit(nogil=True, cache=True)
def dequantize(x, scale, out, lo, hi):
    c_n = x.shape[1]
    if x.shape[2] == 1:  # as `quantize`
        for b, c0, c1 in _item_spans(lo, hi, c_n):
            xr, orow = x[b, :, 0], out[b, :, 0]
            for c in range(c0, c1):
                orow[c] = scale[c] * np.float32(xr[c])
        return
    for item in range(lo, hi):
        b, c = item // c_n, item % c_n
        s = scale[c]
        xr, orow = x[b, c], out[b, c]
        for k in range(xr.shape[0]):
            orow[k] = s * np.float32(xr[k])


@njit(nogil=True, cache=True, inline="always")
def _item_spans(lo, hi, c_n):
    """Items [lo, hi) of (n, c) pairs as (n, c_start, c_end) spans, one per n."""
    spans = []
    item = lo
    while item < hi:
        b, c0 = item // c_n, item % c_n
        c1 = min(c_n, c0 + hi - item)
        spans.append((b, c0, c1))
        item += c1 - c0
    return spans


@njit(nogil=True, cache=True)
def add(a, b, sa, sb, so, out, lo, hi):
    """(sa * a + sb * b) / so per channel; a, b, out: (n, c, r)."""
    c_n = a.shape[1]
    for item in range(lo, hi):
        n, c = item // c_n, item % c_n
        ar, br, orow = a[n, c], b[n, c], out[n, c]
        s_a, s_b, s_o = sa[c], sb[c], so[c]
        for k in range(ar.shape[0]):
            orow[k] = f2i8((s_a * np.float32(ar[k]) + s_b * np.float32(br[k])) / s_o)


@njit(nogil=True, cache=True)
def requantize(x, factor, s_out, out):
    """float2int8(x * factor / s_out) elementwise over flat arrays (per-tensor concat inputs)."""
    for k in range(x.shape[0]):
        out[k] = f2i8(np.float32(x[k]) * factor / s_out)


@njit(nogil=True, cache=True)
def pool(x, out, kh, kw, sh, sw, ph, pw, is_max, lo, hi):
    """TNN's naive int8 pooling: max starting at -127, or an int32 sum divided with truncation."""
    c_n, h, w = x.shape[1], x.shape[2], x.shape[3]
    oh_n, ow_n = out.shape[2], out.shape[3]
    for item in range(lo, hi):
        n, c = item // c_n, item % c_n
        xs = x[n, c]
        for i in range(oh_n):
            h0, h1 = max(i * sh - ph, 0), min(i * sh - ph + kh, h)
            for j in range(ow_n):
                w0, w1 = max(j * sw - pw, 0), min(j * sw - pw + kw, w)
                if is_max:
                    m = np.int32(-127)
                    for y in range(h0, h1):
                        for z in range(w0, w1):
                            m = max(m, np.int32(xs[y, z]))
                    out[n, c, i, j] = np.int8(m)
                else:
                    total = np.int32(0)
                    for y in range(h0, h1):
                        for z in range(w0, w1):
                            total += np.int32(xs[y, z])
                    count = max((h1 - h0) * (w1 - w0), 1)
                    q = abs(total) // count
                    out[n, c, i, j] = np.int8(q if total >= 0 else -q)


@njit(nogil=True, cache=True)
def conv_accumulate(x, w, bias, acc_ws, oh_n, ow_n, sh, sw, dh, dw, pt, pl, groups, lo, hi):
    """acc_ws[item] (oh*ow int32) = bias + sum of int8 products, item = (n, o); exact in int32. Plain indexed
    loops: slicing per row and tap cost more than they saved on these small rows."""
    o_n, icg, kh, kw = w.shape
    h_n, w_n = x.shape[2], x.shape[3]
    opg = o_n // groups
    for item in range(lo, hi):
        n, oc = item // o_n, item % o_n
        acc = acc_ws[item]
        acc[:] = bias[oc]
        c0 = (oc // opg) * icg
        for ic in range(icg):
            xs = x[n, c0 + ic]
            for i in range(kh):
                for j in range(kw):
                    wv = np.int32(w[oc, ic, i, j])
                    off = j * dw - pl
                    c_lo = 0 if off >= 0 else (-off + sw - 1) // sw
                    c_hi = 0 if w_n - off <= 0 else (w_n - off + sw - 1) // sw
                    c_hi = max(min(c_hi, ow_n), c_lo)
                    for oy in range(oh_n):
                        iy = oy * sh - pt + i * dh
                        if iy < 0 or iy >= h_n:
                            continue
                        base = oy * ow_n
                        for ox in range(c_lo, c_hi):
                            acc[base + ox] += wv * np.int32(xs[iy, ox * sw + off])


@njit(nogil=True, cache=True)
def pointwise_accumulate(x, w, bias, acc_ws, groups, lo, hi):
    """1x1 stride-1 unpadded conv: x (n, c, hw), w (o, c/g); acc_ws[item] = bias + w[oc] . x[n]."""
    o_n, icg = w.shape
    opg = o_n // groups
    for item in range(lo, hi):
        n, oc = item // o_n, item % o_n
        acc = acc_ws[item]
        acc[:] = bias[oc]
        c0 = (oc // opg) * icg
        for ic in range(icg):
            wv = np.int32(w[oc, ic])
            xr = x[n, c0 + ic]
            for p in range(acc.shape[0]):
                acc[p] += wv * np.int32(xr[p])


@njit(nogil=True, cache=True)
def conv_epilogue(acc_ws, scale, z, add_scale, relu6_max, act, fusion, out, lo, hi):
    """Requantizes acc to int8 as qconv_reference: act 0 none / 1 relu / 2 relu6; fusion 0 none /
    1 add_then_act / 2 act_then_add with z (n, o, oh*ow) int8. out: (n, o, oh*ow)."""
    o_n, hw = out.shape[1], out.shape[2]
    for item in range(lo, hi):
        n, oc = item // o_n, item % o_n
        acc, orow = acc_ws[item], out[n, oc]
        s, s_add, top = scale[oc], add_scale[oc], relu6_max[oc]
        for k in range(hw):
            zk = z[n, oc, k] if fusion else np.int8(0)
            orow[k] = requantize_one(acc[k], s, zk, s_add, top, act, fusion)


@njit(nogil=True, cache=True, inline="always")
def requantize_one(acc, s, z, s_add, top, act, fusion):
    """One int32 sum (bias included) to int8 as qconv_reference: act 0 none / 1 relu / 2 relu6 (top: the int8
    ceiling); fusion 0 none / 1 add_then_act / 2 act_then_add of the int8 z times s_add."""
    val = np.float32(acc) * s
    if fusion == 1:
        val = val + np.float32(z) * s_add
    if act == 1:
        val = max(val, ZERO)
    elif act == 2:
        return max(min(f2i8(val), top), np.int8(0))
    if fusion == 2:
        val = val + np.float32(z) * s_add
    return f2i8(val)
