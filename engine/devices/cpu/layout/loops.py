"""numba loops on blocked values (N*Cb items of (H, W, B)): pooling (GlobalPoolBlocked, MaxPoolBlocked), the
broadcast binary (BroadcastBlocked) and lane copies (RegroupBlocked).

Each inner loop runs over the B lanes of one pixel (unit stride, vectorised); items [lo, hi) are split over
the engine's pool by threads.parallel_for.

`copy_lanes` writes, for one source src (N, S) (each image's blocked value flattened) and each dst block db of
dst (N, Cbd, HW, B), count[db] runs of consecutive lanes: run j puts run_len[db, j] lanes from dst lane
run_dst[db, j] on, read from the flat source offset run_src[db, j] + p * B on, for every pixel p. A work item's
pixels (one chunk, in cache) are swept once per run for its whole groups of 8, then 4 lanes, in fixed-width loops
that compile to vector moves; the last 1-3 lanes of every run go in one more sweep, all runs per pixel
(GhostNet's 8+8 and 24+24 channel concats: one lane at a time over the whole plane was 16 passes over it, ~1 GB/s;
a variable-length lane loop per pixel and run was 1.6-2x slower than the fixed-width one; a shuffle's single-lane
runs swept one by one were 1.6x slower than all of them per pixel). A dst block that is one whole
source block in lane order (aligned[db] >= 0, the flat offset of that block) is copied as one unit-stride run of
HW * B floats. Its items are (image, dst block, chunk of `chunk` pixels), so that one block of a large plane is
split over the threads too. `zero_lanes` writes zero into the padding lanes of a value's last block; its items are
(image, dst block) pairs.

`permute_lanes` writes each dst block from all of its sources at once, as steps of one vector permute each (one
step per source block the dst block reads, loops/lane_permute.py): step s reads the block s_blk[s] of source
s_in[s] (sources[0, i]: its address, sources[1, i]: floats per image), permutes its lanes by s_idx[s] and keeps those
of the lane mask s_mask[s]; a block's steps are start[db]:start[db + 1], its first one writes zero into the lanes no
step keeps (padding). A channel shuffle's single-lane runs take 2-4 steps a block this way, ~0.2 ns a float against
~0.75 lane by lane (ShuffleNetV2's concat-shuffle-split, 2 vCPUs, AVX-512). Its items are those of copy_lanes; each
step sweeps the item's pixels (a chunk in cache) before the next one, which measured 3x faster than all steps per
pixel.

`copy_team` runs `copy_lanes` as a native OpenMP region function (each thread its share of the items from the job's
words: COPY_*), so a split copy never enters Python on its threads (threads.run_native).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from engine.devices.cpu.loops.lane_permute import permute_merge
from engine.devices.cpu.loops.native import bool_at, f32_at, i32_at, i64_at, open_job, region, team_share

# Offsets built from a row start (start + p * B + lane) are cast to this unsigned type: numba wraps a negative
# signed index around, and that check kept LLVM from vectorising the copies (an aligned block of 784 pixels x 8
# lanes: 238 -> 86 us as 8-lane moves per pixel; as one flat run, below, less again).
_U = np.uint64


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


@njit(nogil=True, cache=True)
def max_pool(x, out, kh, kw, sh, sw, dh, dw, pt, pl, lo, hi):
    """x (M, H, W, B) -> out (M, OH, OW, B): max over each window clipped to the input, for m in [lo, hi).

    Separable: per output row, the max over the window's input rows of whole (W*B) rows (one long unit-stride
    loop), then per output pixel the max over kw of B-lane pieces of it. The first valid row / column initialises;
    a window that holds no input pixel (a dilated one stepping over a small input) gives -inf, as the reference
    does. NaN wins, as in torch. (Written out loop by loop: slices and helper calls here kept LLVM from
    vectorising, 3x slower.)"""
    h, w, b = x.shape[1], x.shape[2], x.shape[3]
    oh_n, ow_n = out.shape[1], out.shape[2]
    wb = w * b
    col = np.empty(wb, x.dtype)
    for m in range(lo, hi):
        xm, om = x[m].reshape(h, wb), out[m].reshape(oh_n, ow_n * b)
        for oh in range(oh_n):
            first = True
            for i in range(kh):
                y = oh * sh - pt + i * dh
                if y < 0 or y >= h:
                    continue
                row = xm[y]
                if first:
                    for t in range(wb):
                        col[t] = row[t]
                    first = False
                else:
                    for t in range(wb):
                        v, a = row[t], col[t]
                        col[t] = v if (v > a) | (v != v) else a
            if first:  # no input row in the window
                for t in range(wb):
                    col[t] = -np.inf
            orow = om[oh]
            for ow in range(ow_n):
                ob = ow * b
                first = True
                for j in range(kw):
                    xx = ow * sw - pl + j * dw
                    if xx < 0 or xx >= w:
                        continue
                    cb = xx * b
                    if first:
                        for k in range(b):
                            orow[ob + k] = col[cb + k]
                        first = False
                    else:
                        for k in range(b):
                            v, a = col[cb + k], orow[ob + k]
                            orow[ob + k] = v if (v > a) | (v != v) else a
                if first:  # no input column in the window
                    for k in range(b):
                        orow[ob + k] = -np.inf


# `job` (int64 words) of `max_pool_if_flagged`: OpenMP's two getters; the flags' address and count (a NaN check's
# answers, loops/pool.not_finite_team); x (M, H, W, B) and out (M, OH, OW, B): addresses and dims; the window's kh,
# kw, sh, sw, dh, dw, pt, pl.
MPF_FLAGS, MPF_PARTS, MPF_X, MPF_M, MPF_H, MPF_W, MPF_B, MPF_OUT, MPF_OH, MPF_OW, MPF_WINDOW = range(2, 13)
MPF_LEN = MPF_WINDOW + 8


@region
def max_pool_if_flagged(data):
    """A recorded max pooling's last step (see MPF_*): where the NaN check before oneDNN's pooling flagged a NaN or
    an infinity in the input, `max_pool` over every item, on this thread, in place of oneDNN's output (which may
    have let a NaN go); the flags cleared for the next run either way. Called outside a region (an OP_CALL)."""
    job, t, team = open_job(data, MPF_LEN)
    if t != 0:
        return
    flags = carray(bool_at(job[MPF_FLAGS]), (job[MPF_PARTS],))
    seen = False
    for i in range(flags.shape[0]):
        seen |= flags[i]
        flags[i] = False
    if not seen:
        return
    m, b = job[MPF_M], job[MPF_B]
    x = carray(f32_at(job[MPF_X]), (m, job[MPF_H], job[MPF_W], b))
    out = carray(f32_at(job[MPF_OUT]), (m, job[MPF_OH], job[MPF_OW], b))
    k = job[MPF_WINDOW:MPF_WINDOW + 8]
    max_pool(x, out, k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], 0, m)


@njit(nogil=True, cache=True, inline="always")
def _apply(op, a, c):
    if op == 0:
        return a + c
    if op == 1:
        return a - c
    if op == 2:
        return a * c
    if op == 3:
        return a if (a > c) | (a != a) else c
    return a if (a < c) | (a != a) else c


@njit(nogil=True, cache=True)
def broadcast_binary(x, s, out, opcode, s_first, lo, hi):
    """out[m, i] = x[m, i] (op) s[m] over the B lanes (s (op) x when s_first), for m in [lo, hi).
    x, out (M, HW, B); s (M, B). opcode: 0 add, 1 sub, 2 mul, 3 maximum, 4 minimum (NaN-propagating).
    The op and operand order are fixed per call, so each lane loop is one branch-free specialisation."""
    hw, b = x.shape[1], x.shape[2]
    for m in range(lo, hi):
        sv = s[m]
        for i in range(hw):
            xr, orow = x[m, i], out[m, i]
            if s_first:
                for k in range(b):
                    orow[k] = _apply(opcode, sv[k], xr[k])
            elif opcode == 2:  # the SE scale, by far the most common
                for k in range(b):
                    orow[k] = xr[k] * sv[k]
            else:
                for k in range(b):
                    orow[k] = _apply(opcode, xr[k], sv[k])


@njit(nogil=True, cache=True)
def copy_lanes(src, dst, count, run_dst, run_src, run_len, aligned, chunk, lo, hi):
    cbd, hw, b = dst.shape[1], dst.shape[2], dst.shape[3]
    chunks = (hw + chunk - 1) // chunk
    for item in range(lo, hi):
        n, rest = item // (cbd * chunks), item % (cbd * chunks)
        db, p0 = rest // chunks, (rest % chunks) * chunk
        p1 = min(p0 + chunk, hw)
        k = count[db]
        if k == 0:
            continue
        s, d = src[n], dst[n, db]
        start = aligned[db]
        if start >= 0:  # one unit-stride run of whole pixels
            flat, to, at = d.reshape(hw * b), _U(p0 * b), _U(start + p0 * b)
            for e in range((p1 - p0) * b):
                flat[to + _U(e)] = s[at + _U(e)]
            continue
        short = False
        for j in range(k):
            first, frm, length = run_dst[db, j], run_src[db, j], run_len[db, j]
            q = 0
            while q + 8 <= length:  # 8 lanes at a time: a fixed-width loop compiles to one vector move per pixel
                at, to = frm + q, first + q
                for p in range(p0, p1):
                    dp, sp = d[p], _U(at + p * b)
                    for lane in range(8):
                        dp[_U(to + lane)] = s[sp + _U(lane)]
                q += 8
            while q + 4 <= length:
                at, to = frm + q, first + q
                for p in range(p0, p1):
                    dp, sp = d[p], _U(at + p * b)
                    for lane in range(4):
                        dp[_U(to + lane)] = s[sp + _U(lane)]
                q += 4
            short = short or q < length
        if short:  # the last 1-3 lanes of the runs, every run per pixel (a shuffle's runs are all single lanes)
            for p in range(p0, p1):
                dp = d[p]
                for j in range(k):
                    first, at, length = run_dst[db, j], run_src[db, j] + p * b, run_len[db, j]
                    for lane in range(length - length % 4, length):
                        dp[_U(first + lane)] = s[_U(at + lane)]


@njit(nogil=True, cache=True)
def permute_lanes(sources, dst, start, s_in, s_blk, s_idx, s_mask, chunk, lo, hi):
    cbd, hw, b = dst.shape[1], dst.shape[2], dst.shape[3]
    chunks = (hw + chunk - 1) // chunk
    d0, i0 = dst.ctypes.data, s_idx.ctypes.data
    for item in range(lo, hi):
        n, rest = item // (cbd * chunks), item % (cbd * chunks)
        db, p0 = rest // chunks, (rest % chunks) * chunk
        p1 = min(p0 + chunk, hw)
        to = d0 + 4 * ((n * cbd + db) * hw + p0) * b
        for s in range(start[db], start[db + 1]):
            i = s_in[s]
            frm = sources[0, i] + 4 * (n * sources[1, i] + (s_blk[s] * hw + p0) * b)
            idx, mask, first = i0 + 4 * b * s, s_mask[s], s == start[db]
            if b == 16:
                for p in range(p1 - p0):
                    permute_merge(to + 64 * p, frm + 64 * p, idx, mask, first, 16)
            elif b == 8:
                for p in range(p1 - p0):
                    permute_merge(to + 32 * p, frm + 32 * p, idx, mask, first, 8)
            elif b == 4:  # (the kernels take this path for blocks of 8 and 16 only)
                for p in range(p1 - p0):
                    permute_merge(to + 16 * p, frm + 16 * p, idx, mask, first, 4)


@njit(nogil=True, cache=True)
def zero_lanes(dst, first, lo, hi):
    """Lanes [first, B) of the last block of each image in [lo, hi) of dst (N, Cbd, HW, B) to zero."""
    last, hw, b = dst.shape[1] - 1, dst.shape[2], dst.shape[3]
    for n in range(lo, hi):
        d = dst[n, last]
        for p in range(hw):
            for lane in range(first, b):
                d[p, lane] = 0.0


# `job` (int64 words) of `zero_team`: the addresses of omp_get_thread_num and omp_get_num_threads; dst's dims (N, CBD,
# HW, B), its address and the first lane to zero.
ZERO_THREAD_NUM, ZERO_NUM_THREADS, ZERO_N, ZERO_CBD, ZERO_HW, ZERO_B, ZERO_DST, ZERO_FIRST, ZERO_LEN = range(9)


@region
def zero_team(data):
    """One OpenMP thread's share of the images of a zero_lanes call (see ZERO_*); called outside a region, all of
    them (a native program's record, fused_calls.py)."""
    job, t, team = open_job(data, ZERO_LEN)
    n = job[ZERO_N]
    lo, hi = team_share(n, t, team)
    if lo >= hi:
        return
    zero_lanes(carray(f32_at(job[ZERO_DST]), (n, job[ZERO_CBD], job[ZERO_HW], job[ZERO_B])), job[ZERO_FIRST], lo, hi)


# `job` (int64 words) of `copy_team`: the addresses of omp_get_thread_num and omp_get_num_threads; the float32 source
# (N, FLAT) and destination (N, CBD, HW, B) and their addresses; the lane map's int64 arrays (count (CBD,), run_dst,
# run_src and run_len (CBD, B), aligned (CBD,)); pixels per item (chunk).
(COPY_THREAD_NUM, COPY_NUM_THREADS, COPY_N, COPY_FLAT, COPY_CBD, COPY_HW, COPY_B, COPY_SRC, COPY_DST, COPY_COUNT,
 COPY_RUN_DST, COPY_RUN_SRC, COPY_RUN_LEN, COPY_ALIGNED, COPY_CHUNK, COPY_LEN) = range(16)


@njit(inline="always")
def _share(n, cbd, hw, chunk, t, team):
    """Thread t's items [lo, hi) of a lane job's (image, dst block, chunk of pixels) items."""
    items = n * cbd * ((hw + chunk - 1) // chunk)
    return team_share(items, t, team)


@region
def copy_team(data):
    """One OpenMP thread's share of the items of a copy_lanes call (see COPY_*)."""
    job, t, team = open_job(data, COPY_LEN)
    n, cbd, hw, b, chunk = job[COPY_N], job[COPY_CBD], job[COPY_HW], job[COPY_B], job[COPY_CHUNK]
    lo, hi = _share(n, cbd, hw, chunk, t, team)
    if lo >= hi:
        return
    copy_lanes(carray(f32_at(job[COPY_SRC]), (n, job[COPY_FLAT])), carray(f32_at(job[COPY_DST]), (n, cbd, hw, b)),
               carray(i64_at(job[COPY_COUNT]), (cbd,)), carray(i64_at(job[COPY_RUN_DST]), (cbd, b)),
               carray(i64_at(job[COPY_RUN_SRC]), (cbd, b)), carray(i64_at(job[COPY_RUN_LEN]), (cbd, b)),
               carray(i64_at(job[COPY_ALIGNED]), (cbd,)), chunk, lo, hi)


# `job` (int64 words) of `permute_team`: the addresses of omp_get_thread_num and omp_get_num_threads; dst (N, CBD, HW,
# B) and its address; the sources' (2, INPUTS) int64 array (addresses, floats per image) and its address; the plan's
# arrays (start (CBD + 1,), s_in, s_blk, s_mask (STEPS,) int64, s_idx (STEPS, B) int32); pixels per item (chunk).
(PERM_THREAD_NUM, PERM_NUM_THREADS, PERM_N, PERM_CBD, PERM_HW, PERM_B, PERM_DST, PERM_INPUTS, PERM_SOURCES,
 PERM_STEPS, PERM_START, PERM_IN, PERM_BLK, PERM_IDX, PERM_MASK, PERM_CHUNK, PERM_LEN) = range(17)


@region
def permute_team(data):
    """One OpenMP thread's share of the items of a permute_lanes call (see PERM_*); called outside a region, all of
    them (a native program's record, fused_calls.py)."""
    job, t, team = open_job(data, PERM_LEN)
    n, cbd, hw, b, chunk = job[PERM_N], job[PERM_CBD], job[PERM_HW], job[PERM_B], job[PERM_CHUNK]
    lo, hi = _share(n, cbd, hw, chunk, t, team)
    if lo >= hi:
        return
    steps = job[PERM_STEPS]
    permute_lanes(carray(i64_at(job[PERM_SOURCES]), (2, job[PERM_INPUTS])),
                  carray(f32_at(job[PERM_DST]), (n, cbd, hw, b)), carray(i64_at(job[PERM_START]), (cbd + 1,)),
                  carray(i64_at(job[PERM_IN]), (steps,)), carray(i64_at(job[PERM_BLK]), (steps,)),
                  carray(i32_at(job[PERM_IDX]), (steps, b)), carray(i64_at(job[PERM_MASK]), (steps,)), chunk, lo, hi)


# Pixels per sweep of last_block_in: 512 x 16 floats (32 KB) stay in L1 while each channel writes its lane of them.
LAST_BLOCK_PIXELS = 512


@njit(nogil=True, cache=True)
def last_block_in(x, out, first, lo, hi):
    """out[n, p, l] = x[n, first + l, p] for the channels from `first` on (fewer than B), zero in the lanes past
    them: ToBlocked's partial last block, images [lo, hi); x (N, C, HW), out (N, CB, HW, B) (the blocked value,
    whose last block this writes), both C-contiguous. Per chunk of LAST_BLOCK_PIXELS pixels the chunk is zeroed
    whole (a memset), then each channel's run of the chunk is read in order and written at its lane of each pixel.
    One thread, one image of 3 channels @224, ms: 0.37 with a row view per pixel, 0.48 a channel at a time over the
    whole plane, 0.22 so."""
    c, hw, b = x.shape[1], x.shape[2], out.shape[3]
    last = out.shape[1] - 1
    for n in range(lo, hi):
        src, dst = x[n].reshape(c * hw), out[n, last].reshape(hw * b)
        for p0 in range(0, hw, LAST_BLOCK_PIXELS):
            p1 = min(hw, p0 + LAST_BLOCK_PIXELS)
            dst[p0 * b:p1 * b] = 0.0
            for k in range(c - first):
                plane = (first + k) * hw
                for p in range(p0, p1):
                    dst[p * b + k] = src[plane + p]


@njit(nogil=True, cache=True)
def last_block_out(x, out, first, lo, hi):
    """out[n, first + l, p] = x[n, last, p, l] for the channels from `first` on (fewer than B): ToPlain's partial
    last block, images [lo, hi); x (N, CB, HW, B) (the blocked value), out (N, C, HW), both C-contiguous. Each
    channel's plane is written in order, its values read a lane apart."""
    c, hw, b = out.shape[1], out.shape[2], x.shape[3]
    last = x.shape[1] - 1
    for n in range(lo, hi):
        src, dst = x[n, last].reshape(hw * b), out[n].reshape(c * hw)
        for k in range(c - first):
            plane = (first + k) * hw
            for p in range(hw):
                dst[plane + p] = src[p * b + k]


# `job` (int64 words) of `last_block_team` and `last_block_out_team`: OpenMP's two getters; the plain (N, C, HW) and
# the blocked (N, CB, HW, B) value's sizes, float32; the source's and the destination's addresses (the plain one and
# the blocked one for ToBlocked, the other way for ToPlain); the first channel of the last block.
LB_N, LB_C, LB_HW, LB_CB, LB_B, LB_SRC, LB_DST, LB_FIRST, LB_LEN = range(2, 11)


@region
def last_block_team(data):
    """One OpenMP thread's share of the images of a last_block_in call (see LB_*); called outside a region, all of
    them (a native program's record)."""
    job, t, team = open_job(data, LB_LEN)
    n = job[LB_N]
    lo, hi = team_share(n, t, team)
    if lo < hi:
        last_block_in(carray(f32_at(job[LB_SRC]), (n, job[LB_C], job[LB_HW])),
                      carray(f32_at(job[LB_DST]), (n, job[LB_CB], job[LB_HW], job[LB_B])), job[LB_FIRST], lo, hi)


@region
def last_block_out_team(data):
    """One OpenMP thread's share of the images of a last_block_out call (see LB_*: the source is the blocked value);
    called outside a region, all of them (a native program's record)."""
    job, t, team = open_job(data, LB_LEN)
    n = job[LB_N]
    lo, hi = team_share(n, t, team)
    if lo < hi:
        last_block_out(carray(f32_at(job[LB_SRC]), (n, job[LB_CB], job[LB_HW], job[LB_B])),
                       carray(f32_at(job[LB_DST]), (n, job[LB_C], job[LB_HW])), job[LB_FIRST], lo, hi)
