"""Winograd F(2x2, 3x3) for 3x3 stride-1 convolutions: 16 GEMMs of (O, C) x (C, tiles) instead of one
(O, 9C) x (9C, pixels), i.e. 2.25x fewer multiplies, plus cheap transforms (Lavin & Gray, 2015).

With d a 4x4 input patch and g a 3x3 filter, one 2x2 output tile is  A^T [(G g G^T) * (B^T d B)] A  with
    B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
    G   = [[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]]
    A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]
Tiles are numbered t = ty * tiles_w + tx over the output; a block of tile rows [ty0, ty1) is transformed at
a time so the scratch stays small, its columns starting at col0 (a block may hold tile rows of several images,
so small maps at batch 8 still make large GEMMs). The kernels work on channel ranges [lo, hi) for threads.parallel_for.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)


def transform_weights(w: np.ndarray) -> np.ndarray:
    """(O, C, 3, 3) filters -> U (16, O, C) float32, U[4a + b] = (G g G^T)[a, b]."""
    u = np.einsum("ai,ocij,bj->aboc", _G, w.astype(np.float64), _G)
    return np.ascontiguousarray(u.reshape(16, w.shape[0], w.shape[1]), np.float32)


@njit(nogil=True, cache=True)
def input_transform(x, v, ty0, ty1, tiles_w, pt, pl, col0, lo, hi):
    """v[4a + b, c, col0 + (ty - ty0)*tiles_w + tx] = (B^T d B)[a, b], d the 4x4 patch of tile (ty, tx) of x[c].

    Each zero-padded input row is split into even and odd columns (so the horizontal transform reads unit
    strides and vectorizes) and transformed once into a ring of four rows: consecutive tile rows overlap by
    two input rows, which the ring shares. After every second row the vertical combine writes one tile row
    of v as contiguous runs.
    """
    h_n, w_n = x.shape[1], x.shape[2]
    tw = tiles_w
    ev = np.empty(tw + 1, np.float32)
    od = np.empty(tw + 1, np.float32)
    hv = np.empty((4, 4, tw), np.float32)  # hv[padded row % 4, j, tx]
    for c in range(lo, hi):
        xc = x[c]
        for pr in range(2 * ty0, 2 * ty1 + 2):  # padded rows of the block's tile rows
            yy = pr - pt
            inside = 0 <= yy < h_n
            for k in range(tw + 1):
                c0 = 2 * k - pl
                ev[k] = xc[yy, c0] if inside and 0 <= c0 < w_n else 0.0
                od[k] = xc[yy, c0 + 1] if inside and 0 <= c0 + 1 < w_n else 0.0
            h = hv[pr % 4]
            h0, h1, h2, h3 = h[0], h[1], h[2], h[3]
            for tx in range(tw):
                e0, e1, o0, o1 = ev[tx], ev[tx + 1], od[tx], od[tx + 1]
                h0[tx] = e0 - e1
                h1[tx] = o0 + e1
                h2[tx] = e1 - o0
                h3[tx] = o0 - o1
            if pr < 2 * ty0 + 3 or (pr - 2 * ty0) % 2 == 0:
                continue
            ty = (pr - 3) // 2  # rows pr-3 .. pr complete tile row ty
            base = col0 + (ty - ty0) * tw
            r0, r1, r2, r3 = hv[(pr - 3) % 4], hv[(pr - 2) % 4], hv[(pr - 1) % 4], hv[pr % 4]
            for j in range(4):
                d0, d1, d2, d3 = r0[j], r1[j], r2[j], r3[j]
                v0, v1 = v[j, c, base:base + tw], v[4 + j, c, base:base + tw]
                v2, v3 = v[8 + j, c, base:base + tw], v[12 + j, c, base:base + tw]
                for tx in range(tw):
                    v0[tx] = d0[tx] - d2[tx]
                    v1[tx] = d1[tx] + d2[tx]
                    v2[tx] = d2[tx] - d1[tx]
                    v3[tx] = d1[tx] - d3[tx]


@njit(nogil=True, cache=True)
def output_transform(m, out, ty0, ty1, tiles_w, col0, lo, hi):
    """out[o, 2ty + a, 2tx + b] = (A^T M A)[a, b] for the tile rows [ty0, ty1) (read from column col0 on of m),
    cropped to out."""
    oh_n, ow_n = out.shape[1], out.shape[2]
    tw = tiles_w
    s = np.empty((2, 4, tw), np.float32)
    row = np.empty(2 * tw, np.float32)
    for o in range(lo, hi):
        yo = out[o]
        for ty in range(ty0, ty1):
            base = col0 + (ty - ty0) * tw
            for j in range(4):  # A^T M over the four rows of column j
                m0, m1 = m[j, o, base:base + tw], m[4 + j, o, base:base + tw]
                m2, m3 = m[8 + j, o, base:base + tw], m[12 + j, o, base:base + tw]
                s0, s1 = s[0, j], s[1, j]
                for tx in range(tw):
                    s0[tx] = m0[tx] + m1[tx] + m2[tx]
                    s1[tx] = m1[tx] - m2[tx] - m3[tx]
            for a in range(2):
                y = 2 * ty + a
                if y >= oh_n:
                    break
                c0, c1, c2, c3 = s[a, 0], s[a, 1], s[a, 2], s[a, 3]
                for tx in range(tw):
                    row[2 * tx] = c0[tx] + c1[tx] + c2[tx]
                    row[2 * tx + 1] = c1[tx] - c2[tx] - c3[tx]
                yo[y, :] = row[:ow_n]
