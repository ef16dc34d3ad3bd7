"""numba loop for GlobalPoolBlocked: per (n, block) item, sum or max over H*W of B-lane rows (vectorised over
the lanes), over items [lo, hi) of N*Cb split by _threads.parallel_for."""

from __future__ import annotations

from numba import njit


@njit(nogil=True, cache=True)
def global_pool(x, out, is_max, lo, hi):
    """x (M, HW, B) -> out (M, B): mean or max over axis 1 for items m in [lo, hi)."""
    hw, b = x.shape[1], x.shape[2]
    scale = 1.0 / hw
    for m in range(lo, hi):
        acc = out[m]
        row = x[m, 0]
        for k in range(b):
            acc[k] = row[k]
        for i in range(1, hw):
            row = x[m, i]
            if is_max:
                for k in range(b):
                    v = row[k]
                    acc[k] = v if (v > acc[k]) | (v != v) else acc[k]
            else:
                for k in range(b):
                    acc[k] += row[k]
        if not is_max:
            for k in range(b):
                acc[k] *= scale
