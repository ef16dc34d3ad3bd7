"""The numba kernels behind Resize: a separable gather with per-row and per-column taps,

out[n, c, oh, ow] = sum_a sum_b wy[oh, a] * wx[ow, b] * x[n, c, iy[oh, a], ix[ow, b]]
Nearest uses one tap of weight 1, bilinear two, bicubic four; the taps come from resize.py. Nearest taps that
repeat every input a whole number of times run as copies (`nearest_repeat`). And the same sums for
the taps of bilinear upsampling by 2 (`bilinear_2x`) as vector passes over every row of many planes at once: 1024
planes of 7x7 (EfficientFormerV2's attention upsampling) took 0.4 ms in the gather, 0.1 ms here.

`resize_team` runs either of those two as a native OpenMP region function (each thread its share of the planes, or
rows, from the job's words: RESIZE_*), so a split resize never enters Python on its threads (threads.run_native).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from engine.devices.cpu.loops.native import f32_at, open_job, region, team_share

_LANES = 16


@njit(nogil=True, cache=True)
def nearest_repeat(x, out, ky, kx, lo, hi):
    """Items [lo, hi) of x (P, H, W) repeated ky times down and kx times across into out (P, H*ky, W*kx) (resize.py
    passes single input rows, (rows, 1, W) into (rows, ky, W*kx), so that few planes still split evenly): nearest
    upsampling by whole factors (YOLO's and UNet's x2), an output row built once and copied to the other ky - 1,
    where the gather read one index per output (128 planes 40 -> 80 on one thread: 0.34 -> 0.28 ms). The copies are
    loops: as slice assignments the same kernel measured 0.34 ms side by side with 0.11 ms as loops."""
    h_n, w_n = x.shape[1], x.shape[2]
    for p in range(lo, hi):
        for i in range(h_n):
            src = x[p, i]
            dst = out[p, i * ky]
            if kx == 2:
                for j in range(w_n):
                    v = src[j]
                    dst[2 * j] = v
                    dst[2 * j + 1] = v
            else:
                for j in range(w_n):
                    v = src[j]
                    for t in range(kx):
                        dst[j * kx + t] = v
            for r in range(1, ky):  # a loop: the slice assignment it replaces was 3x slower (see the docstring)
                row = out[p, i * ky + r]
                for k in range(row.shape[0]):
                    row[k] = dst[k]


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


@intrinsic
def _blend_pairs(typingctx, t, xs, k):
    """t[2j] = 0.25 xs[j - 1] + 0.75 xs[j] and t[2j + 1] = 0.75 xs[j] + 0.25 xs[j + 1] for j in [k, k + 16), as
    <16 x float> code: three unaligned loads, the two blends, then interleaved into two stores (LLVM's vectoriser
    left this loop scalar: stride-2 stores). C-contiguous 1-d float32 arrays; flat offsets."""
    if not all(isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C" for a in (t, xs)):
        return None

    def codegen(context, builder, signature, args):
        f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
        vec = ir.VectorType(f32, _LANES)
        dst = context.make_array(signature.args[0])(context, builder, args[0]).data
        src = context.make_array(signature.args[1])(context, builder, args[1]).data
        k = args[2]

        def load(offset):
            at = builder.gep(src, [builder.add(k, ir.Constant(i64, offset))])
            return builder.load(builder.bitcast(at, vec.as_pointer()), align=4)

        q, t3 = ir.Constant(vec, [0.25] * _LANES), ir.Constant(vec, [0.75] * _LANES)
        prev, cur, nxt = load(-1), load(0), load(1)
        even = builder.fadd(builder.fmul(q, prev), builder.fmul(t3, cur))
        odd = builder.fadd(builder.fmul(t3, cur), builder.fmul(q, nxt))
        for half in range(2):
            mask = [i for j in range(half * _LANES // 2, (half + 1) * _LANES // 2) for i in (j, j + _LANES)]
            pair = builder.shuffle_vector(even, odd, ir.Constant(ir.VectorType(i32, _LANES), mask))
            at = builder.gep(dst, [builder.add(builder.mul(k, ir.Constant(i64, 2)), ir.Constant(i64, half * _LANES))])
            builder.store(pair, builder.bitcast(at, vec.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(t, xs, types.int64), codegen


@intrinsic
def _blend(typingctx, dst, d, src, s0, s1, w0, w1):
    """dst[d + l] = w0 src[s0 + l] + w1 src[s1 + l] for l < 16, as <16 x float> code (numba's loop over a row of a
    small map ran scalar). C-contiguous 1-d float32 arrays; flat offsets."""
    if not all(isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C" for a in (dst, src)):
        return None

    def codegen(context, builder, signature, args):
        vec = ir.VectorType(ir.FloatType(), _LANES)
        out = context.make_array(signature.args[0])(context, builder, args[0]).data
        inp = context.make_array(signature.args[2])(context, builder, args[2]).data

        def at(base, offset):
            return builder.bitcast(builder.gep(base, [offset]), vec.as_pointer())

        def splat(scalar):
            one = builder.insert_element(ir.Constant(vec, ir.Undefined), scalar, ir.Constant(ir.IntType(32), 0))
            return builder.shuffle_vector(one, ir.Constant(vec, ir.Undefined),
                                          ir.Constant(ir.VectorType(ir.IntType(32), _LANES), [0] * _LANES))

        a, b = builder.load(at(inp, args[3]), align=4), builder.load(at(inp, args[4]), align=4)
        value = builder.fadd(builder.fmul(splat(args[5]), a), builder.fmul(splat(args[6]), b))
        builder.store(value, at(out, args[1]), align=4)
        return context.get_dummy_value()

    i64, f32 = types.int64, types.float32
    return types.void(dst, i64, src, i64, i64, f32, f32), codegen


@njit(nogil=True, cache=True, inline="always")
def _blend_row(os, d, t, s0, s1, w0, w1, width):
    """os[d + o] = w0 t[s0 + o] + w1 t[s1 + o] for o < width, in 16-float pieces that may run past the row (not
    past os: there, one element at a time)."""
    for o in range(0, width, _LANES):
        if d + o + _LANES <= os.size:
            _blend(os, d + o, t, s0 + o, s1 + o, w0, w1)
        else:
            for e in range(o, width):
                os[d + e] = w0 * t[s0 + e] + w1 * t[s1 + e]


@njit(nogil=True, cache=True)
def bilinear_2x(x, out, lo, hi):
    """Planes [lo, hi) of x (M, H, W) -> out (M, 2H, 2W): the separable taps of `is_bilinear_2x` (torch's bilinear
    upsampling by 2 with half-pixel centres), with the same products and sums as `separable`.

    For small maps `separable`'s per-plane and per-row costs dominate (1024 planes of 7x7: 0.4 ms). Here each
    pass is one loop over every row of a group of planes at once (unit stride, vectorised): along W, output 2k
    reads inputs k - 1 and k with weights 0.25 and 0.75 and output 2k + 1 inputs k and k + 1 with 0.75 and 0.25,
    for every k of the flat group; then the first and last output of each row, whose taps clamp at the edge, are
    written again. Along H the same with rows for elements. Groups of planes keep the horizontal pass's buffer in
    cache."""
    h, w = x.shape[1], x.shape[2]
    ow = 2 * w
    q, t3, one, zero = np.float32(0.25), np.float32(0.75), np.float32(1.0), np.float32(0.0)
    group = max(1, min(hi - lo, (1 << 16) // (h * ow)))
    t = np.zeros(group * h * ow + _LANES, np.float32)
    for g0 in range(lo, hi, group):
        g1 = min(hi, g0 + group)
        xs = x[g0:g1].reshape(-1)
        os = out[g0:g1].reshape(-1)
        n, rows = xs.size, (g1 - g0) * h
        start = 1
        while start + _LANES < n:  # reads xs[start + 16]: one short of the end
            _blend_pairs(t, xs, start)
            start += _LANES
        for k in range(start, n - 1):
            t[2 * k] = q * xs[k - 1] + t3 * xs[k]
            t[2 * k + 1] = t3 * xs[k] + q * xs[k + 1]
        for r in range(rows):
            a, b = r * w, r * w + w - 1
            t[2 * a] = one * xs[a] + zero * xs[min(a + 1, b)]
            t[2 * b + 1] = t3 * xs[b] + q * xs[b]
        if w > 1:  # the flat loop's ends, inside their rows (rows of one pixel were all written just above)
            t[1] = t3 * xs[0] + q * xs[1]
            t[2 * n - 2] = q * xs[n - 2] + t3 * xs[n - 1]
        # Whole 16-float pieces: a row's last piece runs past its end into the next output row, which is written
        # after it (each even row before its odd row, each odd row before the next even one; the last ones are
        # rewritten by the edge pass below); t has 16 floats of slack for the reads past its last row.
        for r in range(1, rows - 1):
            up, mid, down, even, odd = (r - 1) * ow, r * ow, (r + 1) * ow, 2 * r * ow, (2 * r + 1) * ow
            _blend_row(os, even, t, up, mid, q, t3, ow)
            _blend_row(os, odd, t, mid, down, t3, q, ow)
        for p in range(g1 - g0):
            top, bottom = p * h, p * h + h - 1
            below = min(top + 1, bottom)
            for o in range(ow):
                os[2 * top * ow + o] = one * t[top * ow + o] + zero * t[below * ow + o]
                os[(2 * bottom + 1) * ow + o] = t3 * t[bottom * ow + o] + q * t[bottom * ow + o]
            if h > 1:  # the flat loop skipped the group's first and last rows' other outputs
                if p == 0:
                    for o in range(ow):
                        os[ow + o] = t3 * t[o] + q * t[ow + o]
                if p == g1 - g0 - 1:
                    for o in range(ow):
                        os[2 * bottom * ow + o] = q * t[(bottom - 1) * ow + o] + t3 * t[bottom * ow + o]


# `job` (int64 words) of `resize_team`: the addresses of omp_get_thread_num and omp_get_num_threads, the kernel
# (RESIZE_BILINEAR_2X: x (items, h, w) -> out (items, 2h, 2w); RESIZE_NEAREST: x (items, h, w) -> out (items, h*ky,
# w*kx)), the items, h, w, ky, kx, and the input and output addresses.
(RESIZE_THREAD_NUM, RESIZE_NUM_THREADS, RESIZE_KIND, RESIZE_ITEMS, RESIZE_H, RESIZE_W, RESIZE_KY, RESIZE_KX, RESIZE_X,
 RESIZE_OUT, RESIZE_LEN) = range(11)
RESIZE_BILINEAR_2X, RESIZE_NEAREST = range(2)


@region
def resize_team(data):
    """One OpenMP thread's share of the items of a bilinear_2x or nearest_repeat resize (see RESIZE_*)."""
    job, t, team = open_job(data, RESIZE_LEN)
    items, h, w = job[RESIZE_ITEMS], job[RESIZE_H], job[RESIZE_W]
    lo, hi = team_share(items, t, team)
    if lo >= hi:
        return
    x = carray(f32_at(job[RESIZE_X]), (items, h, w))
    if job[RESIZE_KIND] == RESIZE_BILINEAR_2X:
        bilinear_2x(x, carray(f32_at(job[RESIZE_OUT]), (items, 2 * h, 2 * w)), lo, hi)
    else:
        ky, kx = job[RESIZE_KY], job[RESIZE_KX]
        nearest_repeat(x, carray(f32_at(job[RESIZE_OUT]), (items, h * ky, w * kx)), ky, kx, lo, hi)
