"""numba transforms of Winograd F(4x4, 3x3) on blocked values (nChw{B}c), for winograd_blocked.

With d a 6x6 input patch and g a 3x3 filter, one 4x4 output tile is  A^T [(G g G^T) * (B^T d B)] A  (Lavin &
Gray, 2015) with
    B^T = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
           [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]
    A^T = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]
Tiles are numbered t = (n * tiles_h + ty) * tiles_w + tx; a chunk [t0, t1) of them is transformed at a time so
the GEMM operands stay small. v[6a + b, t - t0, c] holds (B^T d B)[a, b] of input channel c; m[6a + b, t - t0, k]
the GEMM product for output channel k. Every inner loop runs over the B lanes of one pixel (unit stride,
vectorised). Items [lo, hi) are (channel block, slice of the chunk) pairs for threads.parallel_for.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# epilogue codes of output_transform
ACT_NONE, ACT_RELU, ACT_CLIP, ACT_LEAKY = 0, 1, 2, 3


@njit(nogil=True, cache=True, inline="always")
def _rows(d, t, b):
    """t[i] = (B^T d)[i] for a (6, 6, b) patch, along axis 0."""
    for j in range(6):
        for lane in range(b):
            d0, d1, d2, d3, d4, d5 = d[0, j, lane], d[1, j, lane], d[2, j, lane], d[3, j, lane], d[4, j, lane], \
                d[5, j, lane]
            t[0, j, lane] = 4 * d0 - 5 * d2 + d4
            t[1, j, lane] = d3 + d4 - 4 * (d1 + d2)
            t[2, j, lane] = 4 * (d1 - d2) - d3 + d4
            t[3, j, lane] = 2 * (d3 - d1) - d2 + d4
            t[4, j, lane] = 2 * (d1 - d3) - d2 + d4
            t[5, j, lane] = 4 * d1 - 5 * d3 + d5


@njit(nogil=True, cache=True, inline="always")
def _item(item, slices, t0, t1):
    """(channel block, first tile, end tile) of work item `item`: a block and one of `slices` runs of the chunk."""
    block, s = item // slices, item % slices
    return block, t0 + (t1 - t0) * s // slices, t0 + (t1 - t0) * (s + 1) // slices


@njit(nogil=True, cache=True, inline="always")
def _corner(tile, tiles_h, tiles_w):
    """(image, top row, left column) of a tile's 4x4 output."""
    n, r = tile // (tiles_h * tiles_w), tile % (tiles_h * tiles_w)
    return n, 4 * (r // tiles_w), 4 * (r % tiles_w)


@njit(nogil=True, cache=True)
def input_transform(x, v, t0, t1, tiles_h, tiles_w, pt, pl, slices, lo, hi):
    """v[:, t - t0, cb*B:(cb+1)*B] for tiles [t0, t1) of x (N, Cb, H, W, B); padding reads as zero."""
    h_n, w_n, b = x.shape[2], x.shape[3], x.shape[4]
    d = np.empty((6, 6, b), np.float32)
    t = np.empty((6, 6, b), np.float32)
    for item in range(lo, hi):
        cb, first, last = _item(item, slices, t0, t1)
        c0 = cb * b
        for tile in range(first, last):
            n, y0, x0 = _corner(tile, tiles_h, tiles_w)
            y0, x0 = y0 - pt, x0 - pl
            xc = x[n, cb]
            for i in range(6):
                yy = y0 + i
                for j in range(6):
                    xx = x0 + j
                    if 0 <= yy < h_n and 0 <= xx < w_n:
                        px = xc[yy, xx]
                        for lane in range(b):
                            d[i, j, lane] = px[lane]
                    else:
                        for lane in range(b):
                            d[i, j, lane] = 0.0
            _rows(d, t, b)
            col = tile - t0
            for i in range(6):
                for lane in range(b):
                    e0, e1, e2, e3, e4, e5 = t[i, 0, lane], t[i, 1, lane], t[i, 2, lane], t[i, 3, lane], \
                        t[i, 4, lane], t[i, 5, lane]
                    v[6 * i, col, c0 + lane] = 4 * e0 - 5 * e2 + e4
                    v[6 * i + 1, col, c0 + lane] = e3 + e4 - 4 * (e1 + e2)
                    v[6 * i + 2, col, c0 + lane] = 4 * (e1 - e2) - e3 + e4
                    v[6 * i + 3, col, c0 + lane] = 2 * (e3 - e1) - e2 + e4
                    v[6 * i + 4, col, c0 + lane] = 2 * (e1 - e3) - e2 + e4
                    v[6 * i + 5, col, c0 + lane] = 4 * e1 - 5 * e3 + e5


@njit(nogil=True, cache=True)
def output_transform(m, y, z, has_z, bias, act, lo_clip, hi_clip, t0, t1, tiles_h, tiles_w, slices, lo, hi):
    """y[n, kb, 4ty:4ty+4, 4tx:4tx+4] = act(A^T m A + bias (+ z)) for tiles [t0, t1), clipped to y's H, W.

    act: ACT_NONE, ACT_RELU, ACT_CLIP (to [lo_clip, hi_clip]) or ACT_LEAKY (slope lo_clip below zero)."""
    oh, ow, b = y.shape[2], y.shape[3], y.shape[4]
    t = np.empty((4, 6, b), np.float32)
    o = np.empty((4, 4, b), np.float32)
    for item in range(lo, hi):
        kb, first, last = _item(item, slices, t0, t1)
        k0 = kb * b
        for tile in range(first, last):
            n, y0, x0 = _corner(tile, tiles_h, tiles_w)
            col = tile - t0
            for j in range(6):
                for lane in range(b):
                    m0, m1, m2 = m[j, col, k0 + lane], m[6 + j, col, k0 + lane], m[12 + j, col, k0 + lane]
                    m3, m4, m5 = m[18 + j, col, k0 + lane], m[24 + j, col, k0 + lane], m[30 + j, col, k0 + lane]
                    t[0, j, lane] = m0 + m1 + m2 + m3 + m4
                    t[1, j, lane] = m1 - m2 + 2 * (m3 - m4)
                    t[2, j, lane] = m1 + m2 + 4 * (m3 + m4)
                    t[3, j, lane] = m1 - m2 + 8 * (m3 - m4) + m5
            for i in range(4):
                for lane in range(b):
                    e0, e1, e2, e3, e4, e5 = t[i, 0, lane], t[i, 1, lane], t[i, 2, lane], t[i, 3, lane], \
                        t[i, 4, lane], t[i, 5, lane]
                    bb = bias[k0 + lane]
                    o[i, 0, lane] = e0 + e1 + e2 + e3 + e4 + bb
                    o[i, 1, lane] = e1 - e2 + 2 * (e3 - e4) + bb
                    o[i, 2, lane] = e1 + e2 + 4 * (e3 + e4) + bb
                    o[i, 3, lane] = e1 - e2 + 8 * (e3 - e4) + e5 + bb
            rows, cols = min(4, oh - y0), min(4, ow - x0)
            for i in range(rows):
                for j in range(cols):
                    out = y[n, kb, y0 + i, x0 + j]
                    for lane in range(b):
                        val = o[i, j, lane]
                        if has_z:
                            val += z[n, kb, y0 + i, x0 + j, lane]
                        if act == ACT_RELU:
                            val = max(val, 0.0)
                        elif act == ACT_CLIP:
                            val = min(max(val, lo_clip), hi_clip)
                        elif act == ACT_LEAKY and val < 0:
                            val *= lo_clip
                        out[lane] = val
