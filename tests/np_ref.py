"""Plain numpy references for the pass tests (independent of the engine's kernels)."""

from __future__ import annotations

import numpy as np


def conv2d(x, w, b=None, pad=0, groups=1):
    """Direct convolution, stride 1, symmetric zero padding."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    y = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i:i + oh, j:j + ow]
                y[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, w[g * og:(g + 1) * og, :, i, j])
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


def conv_transpose2d(x, w, b=None, stride=1, groups=1):
    """Scatter form of the transposed convolution, no padding."""
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    cg = c // groups
    y = np.zeros((n, og * groups, (h - 1) * stride + kh, (wd - 1) * stride + kw))
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                contrib = np.einsum("nchw,co->nohw", x[:, g * cg:(g + 1) * cg], w[g * cg:(g + 1) * cg, :, i, j])
                rows = slice(i, i + (h - 1) * stride + 1, stride)
                cols = slice(j, j + (wd - 1) * stride + 1, stride)
                y[:, g * og:(g + 1) * og, rows, cols] += contrib
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y
