"""The one numba kernel behind Resize: a separable gather with per-row and per-column taps.

out[n, c, oh, ow] = sum_a sum_b wy[oh, a] * wx[ow, b] * x[n, c, iy[oh, a], ix[ow, b]]
Nearest uses one tap of weight 1, bilinear two, bicubic four; the taps come from resize.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def separable(x, out, iy, wy, ix, wx, lo, hi):
    """Items [lo, hi) of N*C. Index arrays are unsigned so numba adds no negative-index checks.

    Each source row is interpolated horizontally once into a 4-slot cache (slot = row % 4; the <= 4 rows an
    output row reads are consecutive, so they never evict each other), then output rows blend cached rows.
    """
    c_n = x.shape[1]
    oh_n, ow_n = out.shape[2], out.shape[3]
    ty, tx = iy.shape[1], ix.shape[1]
    cache = np.empty((4, ow_n), out.dtype)
    tags = np.empty(4, np.int64)
    for nc in range(lo, hi):
        n, c = nc // c_n, nc % c_n
        tags[:] = -1
        for oh in range(oh_n):
            row = out[n, c, oh]
            if ty == 1 and tx == 1:  # nearest: a pure gather
                xrow = x[n, c, iy[oh, 0]]
                for ow in range(ow_n):
                    row[ow] = xrow[ix[ow, 0]]
                continue
            row[:] = 0
            for a in range(ty):
                r = np.int64(iy[oh, a])
                slot = r % 4
                h = cache[slot]
                if tags[slot] != r:
                    xrow = x[n, c, r]
                    for ow in range(ow_n):
                        t = wx[ow, 0] * xrow[ix[ow, 0]]
                        for b in range(1, tx):
                            t += wx[ow, b] * xrow[ix[ow, b]]
                        h[ow] = t
                    tags[slot] = r
                wa = wy[oh, a]
                for ow in range(ow_n):
                    row[ow] += wa * h[ow]
