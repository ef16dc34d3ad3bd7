"""numba kernels behind the fast Conv / ConvTranspose paths: im2col, col2im, depthwise and the fused epilogue.

Every function is compiled lazily on first call (per dtype) and cached on disk, and releases the GIL. The
kernels work on items [lo, hi) of their outer axis (channels, or N*C) so engine.ops._threads.parallel_for can
split them over threads. They take one image (no batch axis) unless said otherwise, so the caller can tile
and loop without slicing copies.

Pad modes are small ints: 0 zeros, 1 reflect, 2 replicate, 3 circular (the Conv `pad_mode` param).
Activation codes for the epilogue: 0 none, 1 relu, 2 clip(lo, hi) (relu6 = clip(0, 6)), 3 leaky_relu(alpha);
anything else runs after the kernel through engine.ops._epilogue.apply_activation.
"""

from __future__ import annotations

import numpy as np
from numba import njit

PAD_MODES = {"zeros": 0, "constant": 0, "reflect": 1, "replicate": 2, "edge": 2, "circular": 3}
ACT_NONE, ACT_RELU, ACT_CLIP, ACT_LEAKY = 0, 1, 2, 3


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
                r = (c * kh + i) * kw + j
                woff = j * dw - pl
                w_lo, w_hi = _valid_range(woff, sw, w_n, ow_n)
                for t in range(rows):
                    base = t * ow_n
                    ih = _src((oh0 + t) * sh - pt + i * dh, h_n, mode)
                    if ih < 0:
                        for ow in range(ow_n):
                            cols[r, base + ow] = 0
                        continue
                    if mode == 0:
                        for ow in range(w_lo):
                            cols[r, base + ow] = 0
                        if sw == 1:  # unit stride: a contiguous copy the compiler vectorises
                            dst, src = cols[r, base + w_lo:base + w_hi], x[c, ih, w_lo + woff:w_hi + woff]
                            for k in range(w_hi - w_lo):
                                dst[k] = src[k]
                        else:
                            for ow in range(w_lo, w_hi):
                                cols[r, base + ow] = x[c, ih, ow * sw + woff]
                        for ow in range(w_hi, ow_n):
                            cols[r, base + ow] = 0
                    else:
                        for ow in range(ow_n):
                            cols[r, base + ow] = x[c, ih, _src(ow * sw + woff, w_n, mode)]


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
                r = (o * kh + i) * kw + j
                woff = j * dw - pl
                w_lo, w_hi = _valid_range(woff, sw, ow_n, w_n)
                for t in range(rows):
                    oh = (h0 + t) * sh - pt + i * dh
                    if oh < 0 or oh >= oh_n:
                        continue
                    base = t * w_n
                    for w in range(w_lo, w_hi):
                        out[o, oh, w * sw + woff] += cols[r, base + w]


@njit(nogil=True, cache=True)
def depthwise(x, w, bias, z, has_z, out, sh, sw, dh, dw, pt, pl, act, a_lo, a_hi, alpha, lo, hi):
    """Direct depthwise conv (groups == C == O) with bias, optional residual z and a simple activation fused.

    x (N, C, H, W), w (C, kh, kw), bias (C,), z like out or a dummy, out (N, C, OH, OW); zero padding.
    """
    c_n, h_n, w_n = x.shape[1], x.shape[2], x.shape[3]
    oh_n, ow_n = out.shape[2], out.shape[3]
    kh, kw = w.shape[1], w.shape[2]
    for nc in range(lo, hi):
        n = nc // c_n
        c = nc % c_n
        for oh in range(oh_n):
            row = out[n, c, oh]
            for ow in range(ow_n):
                row[ow] = bias[c]
            for i in range(kh):
                ih = oh * sh - pt + i * dh
                if ih < 0 or ih >= h_n:
                    continue
                src = x[n, c, ih]
                for j in range(kw):
                    wv = w[c, i, j]
                    woff = j * dw - pl
                    lo_j, hi_j = _valid_range(woff, sw, w_n, ow_n)
                    if sw == 1:
                        for ow in range(lo_j, hi_j):
                            row[ow] += wv * src[ow + woff]
                    else:
                        for ow in range(lo_j, hi_j):
                            row[ow] += wv * src[ow * sw + woff]
            for ow in range(ow_n):
                v = row[ow]
                if has_z:
                    v += z[n, c, oh, ow]
                row[ow] = _act(v, act, a_lo, a_hi, alpha)


@njit(nogil=True, cache=True, inline="always")
def _act(v, act, lo, hi, alpha):
    if act == 1:
        return v if v > 0 else v * 0
    if act == 2:
        return min(max(v, lo), hi)
    if act == 3:
        return v if v >= 0 else v * alpha
    return v


@njit(nogil=True, cache=True)
def epilogue(y, bias, z, has_z, act, a_lo, a_hi, alpha, lo, hi):
    """y[o, l] = act(y[o, l] + bias[o] (+ z[o, l])) in place for o in [lo, hi); y and z are (O, L) views."""
    l_n = y.shape[1]
    for o in range(lo, hi):
        b = bias[o]
        if has_z:
            for k in range(l_n):
                y[o, k] = _act(y[o, k] + b + z[o, k], act, a_lo, a_hi, alpha)
        else:
            for k in range(l_n):
                y[o, k] = _act(y[o, k] + b, act, a_lo, a_hi, alpha)


def act_code(name: str | None, params: dict | None) -> tuple[int, float, float, float] | None:
    """(code, lo, hi, alpha) for activations the numba kernels fuse, None for the others."""
    p = params or {}
    if name is None:
        return ACT_NONE, 0.0, 0.0, 0.0
    if name == "relu":
        return ACT_RELU, 0.0, 0.0, 0.0
    if name == "relu6":
        return ACT_CLIP, 0.0, 6.0, 0.0
    if name == "clip":
        lo, hi = p.get("min"), p.get("max")
        return ACT_CLIP, -np.inf if lo is None else float(lo), np.inf if hi is None else float(hi), 0.0
    if name == "leaky_relu":
        return ACT_LEAKY, 0.0, 0.0, float(p.get("alpha", 0.01))
    return None
