"""numba copy of lanes between blocked values: the kernel behind RegroupBlocked (layout_channels.py).

`copy_lanes` writes, for one source src (N, S) (each image's blocked value flattened) and each dst block db of
dst (N, Cbd, HW, B), the count[db] lanes dst_lane[db, :count] from the flat source offsets
src_off[db, :count] + p * B of pixel p. A dst block that is one whole source block in lane order
(aligned[db] >= 0, the flat offset of that block) is copied as one unit-stride run of HW * B floats. `zero_lanes`
writes zero into the padding lanes of a value's last block. Items [lo, hi) are (image, dst block) pairs, split
over the engine's pool by _threads.parallel_for.
"""

from __future__ import annotations

from numba import njit


@njit(nogil=True, cache=True)
def copy_lanes(src, dst, count, dst_lane, src_off, aligned, lo, hi):
    cbd, hw, b = dst.shape[1], dst.shape[2], dst.shape[3]
    for item in range(lo, hi):
        n, db = item // cbd, item % cbd
        k = count[db]
        if k == 0:
            continue
        s, d = src[n], dst[n, db]
        start = aligned[db]
        if start >= 0:
            for p in range(hw):
                for lane in range(b):
                    d[p, lane] = s[start + p * b + lane]
            continue
        flat = d.reshape(hw * b)
        for j in range(k):  # one strided lane at a time, as strided views: no index arithmetic in the inner loop
            lane, off = dst_lane[db, j], src_off[db, j]
            to, frm = flat[lane:lane + hw * b:b], s[off:off + hw * b:b]
            for p in range(hw):
                to[p] = frm[p]


@njit(nogil=True, cache=True)
def zero_lanes(dst, first, lo, hi):
    """Lanes [first, B) of the last block of each image in [lo, hi) of dst (N, Cbd, HW, B) to zero."""
    last, hw, b = dst.shape[1] - 1, dst.shape[2], dst.shape[3]
    for n in range(lo, hi):
        d = dst[n, last]
        for p in range(hw):
            for lane in range(first, b):
                d[p, lane] = 0.0
