"""Winograd F(2x2, 3x3) for 3x3 stride-1 convolutions: 16 GEMMs of (O, C) x (C, tiles) instead of one
(O, 9C) x (9C, pixels), i.e. 2.25x fewer multiplies, plus cheap transforms (Lavin & Gray, 2015).

With d a 4x4 input patch and g a 3x3 filter, one 2x2 output tile is  A^T [(G g G^T) * (B^T d B)] A  with
    B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
    G   = [[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]]
    A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]
Tiles are numbered t = ty * tiles_w + tx over the output; a block of tile rows [ty0, ty1) is transformed at
a time so the scratch stays small. The kernels work on channel ranges [lo, hi) for _threads.parallel_for.
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
def input_transform(x, v, ty0, ty1, tiles_w, pt, pl, lo, hi):
    """v[4a + b, c, (ty - ty0)*tiles_w + tx] = (B^T d B)[a, b], d the 4x4 patch of tile (ty, tx) of x[c].

    One tile row at a time: four zero-padded input rows, their horizontal transforms for every tile of
    the row, then the vertical combine written as contiguous rows of v.
    """
    h_n, w_n = x.shape[1], x.shape[2]
    tw = tiles_w
    width = 2 * tw + 2
    rows = np.zeros((4, width), np.float32)
    hv = np.empty((4, 4, tw), np.float32)
    x_lo, x_hi = max(pl, 0), min(width, w_n + pl)  # padded columns [x_lo, x_hi) come from x
    for c in range(lo, hi):
        xc = x[c]
        for ty in range(ty0, ty1):
            for i in range(4):
                r, yy = rows[i], 2 * ty - pt + i
                r[:] = 0
                if 0 <= yy < h_n and x_hi > x_lo:
                    r[x_lo:x_hi] = xc[yy, x_lo - pl:x_hi - pl]
                h = hv[i]
                h0, h1, h2, h3 = h[0], h[1], h[2], h[3]
                for tx in range(tw):
                    a0, a1, a2, a3 = r[2 * tx], r[2 * tx + 1], r[2 * tx + 2], r[2 * tx + 3]
                    h0[tx], h1[tx], h2[tx], h3[tx] = a0 - a2, a1 + a2, a2 - a1, a1 - a3
            base = (ty - ty0) * tw
            for j in range(4):
                d0, d1, d2, d3 = hv[0, j], hv[1, j], hv[2, j], hv[3, j]
                v0, v1 = v[j, c, base:base + tw], v[4 + j, c, base:base + tw]
                v2, v3 = v[8 + j, c, base:base + tw], v[12 + j, c, base:base + tw]
                for tx in range(tw):
                    v0[tx] = d0[tx] - d2[tx]
                    v1[tx] = d1[tx] + d2[tx]
                    v2[tx] = d2[tx] - d1[tx]
                    v3[tx] = d1[tx] - d3[tx]


@njit(nogil=True, cache=True)
def output_transform(m, out, ty0, ty1, tiles_w, lo, hi):
    """out[o, 2ty + a, 2tx + b] = (A^T M A)[a, b] for the tile rows [ty0, ty1), cropped to out."""
    oh_n, ow_n = out.shape[1], out.shape[2]
    tw = tiles_w
    s = np.empty((2, 4, tw), np.float32)
    row = np.empty(2 * tw, np.float32)
    for o in range(lo, hi):
        yo = out[o]
        for ty in range(ty0, ty1):
            base = (ty - ty0) * tw
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
