"""numba loops of the NHWC int8 ops, bit-exact with the references (engine/ops/quant.py) like loops/quant.py,
whose float2int8 (`f2i8`) and conv requantization (`requantize_one`) they share. Channels are the innermost
axis, so the per-channel loops run over contiguous memory. Work is split over items [lo, hi) by
threads.parallel_for (items are rows: (n, y) pairs or pixels, as each loop says).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from engine.devices.cpu.loops.native import (
    bool_at,
    f32_at,
    i8_at,
    i32_at,
    i64_at,
    i64_view,
    open_job,
    region,
    team_share,
)
from engine.devices.cpu.loops.normalize import softmax_loop
from engine.devices.cpu.loops.quant import f2i8, requantize_one

ZERO = np.float32(0.0)


@njit(nogil=True, cache=True)
def quantize(x, scale, flip, out, nan, lo, hi):
    """x (N, C, H, W) float32 -> out (N, H, W * C) int8 (NHWC with each row flat), float2int8(x / scale[c]) ^ flip
    (0, or -128: the bytes of q + 128 as uint8, a u8 conv input with zero point 128; an int8 xor keeps the loop
    vectorized where adding 128 as an int made the 3-channel one 25% slower); items (n, y). Each row is quantized
    contiguously first (vectorized; saturating values made the strided version branch), then interleaved channel
    by channel: a strided store per channel over a flat row is 3.5x faster than the pixel-by-pixel loop over a
    runtime channel count (a 3x240x320 input: 0.27 -> 0.10 ms). nan[item] is set where the item's input rows hold
    a NaN (f2i8 would give a number for it; the caller refuses the run), read row by row while the row is in
    cache: a separate pass over a batch of 8 images (7.4 MB, past L2) cost as much as the quantization."""
    c_n, h_n, w_n = x.shape[1], x.shape[2], x.shape[3]
    rows = np.empty((c_n, w_n), np.int8)
    for item in range(lo, hi):
        n, y = item // h_n, item % h_n
        seen = False
        for c in range(c_n):
            s, xr = scale[c], x[n, c, y]
            for xx in range(w_n):
                seen |= xr[xx] != xr[xx]
            if s == ZERO:
                rows[c, :] = 0
                continue
            row = rows[c]
            for xx in range(w_n):
                row[xx] = f2i8(xr[xx] / s)
        nan[item] = seen
        o = out[n, y]
        for c in range(c_n):
            row = rows[c]
            for xx in range(w_n):
                o[xx * c_n + c] = row[xx] ^ flip


@njit(nogil=True, cache=True)
def quantize3(x, scale, flip, out, nan, lo, hi):
    """`quantize` of a 3-channel input (an image) whose scales are all non-zero: one pass writing each pixel's
    three bytes, the channel count known to the compiler (a 3x240x320 input: 0.100 -> 0.056 ms on one thread),
    and noting a NaN in nan[item] as `quantize` does."""
    h_n, w_n = x.shape[2], x.shape[3]
    s0, s1, s2 = scale[0], scale[1], scale[2]
    for item in range(lo, hi):
        n, y = item // h_n, item % h_n
        x0, x1, x2, o = x[n, 0, y], x[n, 1, y], x[n, 2, y], out[n, y]
        seen = False
        for xx in range(w_n):
            seen |= (x0[xx] != x0[xx]) | (x1[xx] != x1[xx]) | (x2[xx] != x2[xx])
        nan[item] = seen
        for xx in range(w_n):
            o[3 * xx] = f2i8(x0[xx] / s0) ^ flip
            o[3 * xx + 1] = f2i8(x1[xx] / s1) ^ flip
            o[3 * xx + 2] = f2i8(x2[xx] / s2) ^ flip


# `job` (int64 words) of `quantize_team`: OpenMP's two getters (open_job); N, C, H, W of the float32 input; its,
# the float32 scales' and the int8 output's (N, H, W * C) addresses; the flip (0 or -128); the NaN flags' address
# (N * H booleans); whether the loop is `quantize3`.
QN_N, QN_C, QN_H, QN_W, QN_X, QN_SCALE, QN_OUT, QN_FLIP, QN_NAN, QN_THREE, QN_LEN = range(2, 13)


@region
def quantize_team(data):
    """One OpenMP thread's share of the rows (n, y) of a `quantize` or `quantize3` (see QN_*), as parallel_for
    splits them; the caller reads the NaN flags after the region."""
    job, t, team = open_job(data, QN_LEN)
    n, c, h, w = job[QN_N], job[QN_C], job[QN_H], job[QN_W]
    lo, hi = team_share(n * h, t, team)
    if lo >= hi:
        return
    x, scale = carray(f32_at(job[QN_X]), (n, c, h, w)), carray(f32_at(job[QN_SCALE]), (c,))
    out, nan = carray(i8_at(job[QN_OUT]), (n, h, w * c)), carray(bool_at(job[QN_NAN]), (n * h,))
    flip = np.int8(job[QN_FLIP])
    if job[QN_THREE] != 0:
        quantize3(x, scale, flip, out, nan, lo, hi)
    else:
        quantize(x, scale, flip, out, nan, lo, hi)


@njit(nogil=True, cache=True)
def spread(x, table, out, lo, hi):
    """x (P, C) bytes (int8, or u8 with a zero point, viewed as uint8) -> out (P, 2C) uint8: each byte's int8 value
    q as max(q, 0) at 2c and max(-q, 0) at 2c + 1 (0..128), both from `table`, the 256 pairs as little-endian
    uint16 (a lookup per value: 1.5-2x faster here than computing the pair, whose byte arithmetic numba widens);
    items pixels. A u8 conv over `out` with the weights w, -w alike sums the conv of q, and vpmaddubsw's byte
    pairs of inputs up to 128 never saturate (conv.py: spread inputs)."""
    c_n = x.shape[1]
    flat, pairs = x.reshape(-1), out.reshape(-1).view(np.uint16)
    for i in range(lo * c_n, hi * c_n):
        pairs[i] = table[flat[i]]


@njit(nogil=True, cache=True)
def dequantize(x, scale, out, lo, hi):
    """x (N, H, W, C) int8 -> out (N, C, H, W) float32, scale[c] * x; items (n, y)."""
    h_n, w_n, c_n = x.shape[1], x.shape[2], x.shape[3]
    for item in range(lo, hi):
        n, y = item // h_n, item % h_n
        for c in range(c_n):
            s = scale[c]
            for xx in range(w_n):
                out[n, c, y, xx] = s * np.float32(x[n, y, xx, c])


@njit(nogil=True, cache=True)
def dequantize_mean(x, scale, out, lo, hi):
    """x (N, P, C) int8 -> out (N, C) float32: each channel's mean over the P pixels of scale[c] * x, each
    product rounded to float32 (the dequantized value), summed in float64 in pixel order and divided by P: the
    reference's float64 mean of the dequantized values, bit for bit (one channel's products share its scale, so
    their float64 sum is exact in any order); the channels vectorised; items images."""
    p_n, c_n = x.shape[1], x.shape[2]
    acc = np.empty(c_n, np.float64)
    for n in range(lo, hi):
        acc[:] = 0.0
        for p in range(p_n):
            xp = x[n, p]
            for c in range(c_n):
                acc[c] += np.float64(scale[c] * np.float32(xp[c]))
        o = out[n]
        for c in range(c_n):
            o[c] = np.float32(acc[c] / p_n)


# `job` (int64 words) of `dequantize_mean_team`: OpenMP's two getters (open_job); N, P, C; the int8 input's,
# the float32 scales' and the float32 output's addresses.
DM_N, DM_P, DM_C, DM_X, DM_SCALE, DM_OUT, DM_LEN = range(2, 9)


@region
def dequantize_mean_team(data):
    """One OpenMP thread's share of the images of a `dequantize_mean` (see DM_*), as parallel_for splits them;
    called outside a region, all of them (a native program's call)."""
    job, t, team = open_job(data, DM_LEN)
    n, p, c = job[DM_N], job[DM_P], job[DM_C]
    lo, hi = team_share(n, t, team)
    if lo < hi:
        dequantize_mean(carray(i8_at(job[DM_X]), (n, p, c)), carray(f32_at(job[DM_SCALE]), (c,)),
                        carray(f32_at(job[DM_OUT]), (n, c)), lo, hi)


@njit(nogil=True, cache=True)
def dequantize_pixels(x, scale, out, lo, hi):
    """x (P, C) int8 -> out (P, C) float32, scale[c] * x; items pixels (the inner loop vectorizes)."""
    c_n = x.shape[1]
    for p in range(lo, hi):
        xp, op = x[p], out[p]
        for c in range(c_n):
            op[c] = scale[c] * np.float32(xp[c])


@njit(nogil=True, cache=True)
def dequantize_into(x, pattern, out, at, lo, hi):
    """One head of a joined dequantize: x (N, F) int8, each image's NHWC values flat -> out[n, at:at + F] of out
    (N, G) float32, scale[c] * x; `pattern` is the per-channel scales repeated over a whole number of pixels, so
    that the inner loop runs over it with no channel index and vectorizes (a pixel-by-pixel loop over 2-12
    channels took 2.7 ns a value); items are images."""
    f_n, k_n = x.shape[1], pattern.shape[0]
    full = f_n - f_n % k_n
    for n in range(lo, hi):
        xr, o = x[n], out[n, at:at + f_n]
        for b in range(0, full, k_n):
            xb, ob = xr[b:b + k_n], o[b:b + k_n]  # views: the loop's index is never negative, so it vectorizes
            for k in range(k_n):
                ob[k] = pattern[k] * np.float32(xb[k])
        xb, ob = xr[full:], o[full:]
        for k in range(f_n - full):
            ob[k] = pattern[k] * np.float32(xb[k])


@njit(nogil=True, cache=True)
def softmax_rows(x, lo, hi):
    """Softmax of each row of x (R, K) float32 in place, rows [lo, hi). A pair (a detector's two class scores)
    takes one exp, in float32, e = exp(-|a - b|): the larger gets 1 / (1 + e), the other e / (1 + e) (UltraFace's
    4420 pairs: 25 us on one thread, where oneDNN's softmax over an axis of 2 took 113); other rows go through
    the Softmax kernel's loop."""
    k_n, one = x.shape[1], np.float32(1.0)
    if k_n == 2:
        for r in range(lo, hi):
            a, b = x[r, 0], x[r, 1]
            if a == np.inf or b == np.inf:  # exp(v - max) has inf - inf = NaN there (both +inf: a - b is NaN below)
                x[r, 0], x[r, 1] = np.nan, np.nan
                continue
            e = np.exp(-abs(a - b))
            s = one + e
            big, small = one / s, e / s
            if a >= b:
                x[r, 0], x[r, 1] = big, small
            else:
                x[r, 0], x[r, 1] = small, big
        return
    rows = x[lo:hi].reshape(hi - lo, k_n, 1)
    softmax_loop(rows, rows, False, False)


# `job` (int64 words) of `dequantize_concat_team`: OpenMP's two getters (open_job); the images N, the values G of
# an image's joined output, the values K of its last axis (a row: the softmax's), whether rows take the softmax,
# the heads' count, the float32 output's (N, G) address; then DC_HEAD words a head: its int8 (N, F) values'
# address, F, where its values start in an image's G, its scale pattern's address and length (`_pattern`).
DC_N, DC_G, DC_K, DC_SOFTMAX, DC_HEADS, DC_OUT, DC_LEN = range(2, 9)
DC_X, DC_F, DC_AT, DC_PATTERN, DC_PLEN, DC_HEAD = range(6)


@njit(nogil=True, cache=True)
def dequantize_span(x, pattern, first, out):
    """out[j] = pattern[(first + j) % len(pattern)] * x[j]: a head's values from its `first`-th pattern place (a
    span that starts inside a pattern), then whole patterns (views, no channel index: the loop vectorizes)."""
    k_n, f_n = pattern.shape[0], x.shape[0]
    lead = min((k_n - first) % k_n, f_n)
    for j in range(lead):
        out[j] = pattern[first + j] * np.float32(x[j])
    full = lead + (f_n - lead) // k_n * k_n
    for b in range(lead, full, k_n):
        xb, ob = x[b:b + k_n], out[b:b + k_n]
        for k in range(k_n):
            ob[k] = pattern[k] * np.float32(xb[k])
    for j in range(full, f_n):
        out[j] = pattern[j - full] * np.float32(x[j])


@njit(nogil=True, cache=True)
def dequantize_concat_rows(job, lo, hi):
    """Rows [lo, hi) of a joined dequantize (`job`: DC_*), rows of K values over all N * G: each head's values that
    fall in them dequantized into place, then their softmax where the job has it. Rows never cross an image (K
    divides G), so a thread's rows need no other thread's values."""
    n_img, g, k = job[DC_N], job[DC_G], job[DC_K]
    out = carray(f32_at(job[DC_OUT]), (n_img * g,))
    v0, v1 = lo * k, hi * k
    for h in range(job[DC_HEADS]):
        at = DC_LEN + h * DC_HEAD
        f, start, p_len = job[at + DC_F], job[at + DC_AT], job[at + DC_PLEN]
        x = carray(i8_at(job[at + DC_X]), (n_img * f,))
        pattern = carray(f32_at(job[at + DC_PATTERN]), (p_len,))
        for n in range(v0 // g, min((v1 + g - 1) // g, n_img)):
            a = max(v0, n * g + start)
            b = min(v1, n * g + start + f)
            if a < b:
                j = a - n * g - start
                dequantize_span(x[n * f + j:n * f + j + b - a], pattern, j % p_len, out[a:b])
    if job[DC_SOFTMAX] != 0:
        softmax_rows(out.reshape(n_img * g // k, k), lo, hi)


@region
def dequantize_concat_team(data):
    """One OpenMP thread's share of a joined dequantize's rows (dequantize_concat_rows), as parallel_for splits
    them."""
    job, t, team = open_job(data, DC_LEN)
    rows = job[DC_N] * job[DC_G] // job[DC_K]
    lo, hi = team_share(rows, t, team)
    if lo < hi:
        dequantize_concat_rows(carray(i64_view(data), (DC_LEN + job[DC_HEADS] * DC_HEAD,)), lo, hi)


@njit(nogil=True, cache=True, error_model="numpy")
def add(a, b, sa, sb, so, floor, out, lo, hi):
    """max((sa * a + sb * b) / so, floor) per channel over (P, C) pixels (floor: -128, or 0 for a fused ReLU);
    items are pixels (row views: the inner loop vectorizes). numba's numpy error model: its Python one tests
    every divisor for zero (to raise ZeroDivisionError), a branch that kept LLVM from vectorizing the loop
    (56x56x64 pixels: 430 -> 75 us on one thread); a scale of 0 gives the reference's +-inf, saturated to 127 /
    -128. (The quantize loops and concat_part, which divide too, gained nothing from it.)"""
    c_n = a.shape[1]
    for p in range(lo, hi):
        ap, bp, op = a[p], b[p], out[p]
        for c in range(c_n):
            op[c] = max(f2i8((sa[c] * np.float32(ap[c]) + sb[c] * np.float32(bp[c])) / so[c]), floor)


# `job` (int64 words) of `add_team`: the addresses of omp_get_thread_num and omp_get_num_threads; the pixels and
# channels; the int8 inputs a and b, the float32 scales sa, sb, so (C,), the floor, the int8 output.
(ADD_THREAD_NUM, ADD_NUM_THREADS, ADD_P, ADD_C, ADD_A, ADD_B, ADD_SA, ADD_SB, ADD_SO, ADD_FLOOR, ADD_OUT,
 ADD_LEN) = range(12)


@region
def add_team(data):
    """One OpenMP thread's share of the pixels of an `add` call (see ADD_*); called outside a region, all of them
    (a native program's record: devices/cpu/fused_calls.py)."""
    job, t, team = open_job(data, ADD_LEN)
    p, c = job[ADD_P], job[ADD_C]
    lo, hi = team_share(p, t, team)
    if lo >= hi:
        return
    add(carray(i8_at(job[ADD_A]), (p, c)), carray(i8_at(job[ADD_B]), (p, c)), carray(f32_at(job[ADD_SA]), (c,)),
        carray(f32_at(job[ADD_SB]), (c,)), carray(f32_at(job[ADD_SO]), (c,)), np.int8(job[ADD_FLOOR]),
        carray(i8_at(job[ADD_OUT]), (p, c)), lo, hi)


# `job` (int64 words) of `fix_team`: the addresses of omp_get_thread_num and omp_get_num_threads; then, each as its
# address and dims, x (N, H, W, C) and out (N, OH, OW, O) int8, the weight rows w (K, KH, KW, ICG) int8, the
# channels `chans` (K,) int64 and their `table` (K, 256) bool; bias (O,) int32, scale (O,) float32, relu6_max (O,)
# int8 and geo (7,) int64 by address; the activation code.
FIX_THREAD_NUM, FIX_NUM_THREADS, FIX_X, FIX_X_DIMS, FIX_OUT, FIX_OUT_DIMS, FIX_W, FIX_W_DIMS = 0, 1, 2, 3, 7, 8, 12, 13
FIX_CHANS, FIX_K, FIX_TABLE, FIX_BIAS, FIX_SCALE, FIX_RELU6, FIX_GEO, FIX_ACT, FIX_LEN = range(17, 26)


@region
def fix_team(data):
    """One OpenMP thread's share of the items (n, oy) of a fix_suspects call (see FIX_*); called outside a region,
    all of them (a native program's record: devices/cpu/fused_calls.py)."""
    job, t, team = open_job(data, FIX_LEN)
    xd, od, wd = FIX_X_DIMS, FIX_OUT_DIMS, FIX_W_DIMS
    x = carray(i8_at(job[FIX_X]), (job[xd], job[xd + 1], job[xd + 2], job[xd + 3]))
    out = carray(i8_at(job[FIX_OUT]), (job[od], job[od + 1], job[od + 2], job[od + 3]))
    w = carray(i8_at(job[FIX_W]), (job[wd], job[wd + 1], job[wd + 2], job[wd + 3]))
    k, o = job[FIX_K], job[od + 3]
    items = out.shape[0] * out.shape[1]
    lo, hi = team_share(items, t, team)
    if lo >= hi:
        return
    fix_suspects(x, w, carray(i32_at(job[FIX_BIAS]), (o,)), carray(f32_at(job[FIX_SCALE]), (o,)),
                 carray(i8_at(job[FIX_RELU6]), (o,)), job[FIX_ACT], carray(i64_at(job[FIX_CHANS]), (k,)),
                 carray(bool_at(job[FIX_TABLE]), (k, 256)), carray(i64_at(job[FIX_GEO]), (7,)), out, lo, hi)


@njit(nogil=True, cache=True)
def pool(x, out, kh, kw, sh, sw, ph, pw, is_max, lo, hi):
    """TNN's naive int8 pooling on (N, H, W, C): max starting at -127, or an int32 sum divided with truncation;
    items (n, oy)."""
    h_n, w_n, c_n = x.shape[1], x.shape[2], x.shape[3]
    oh_n, ow_n = out.shape[1], out.shape[2]
    acc = np.empty(c_n, np.int32)
    for item in range(lo, hi):
        n, i = item // oh_n, item % oh_n
        h0, h1 = max(i * sh - ph, 0), min(i * sh - ph + kh, h_n)
        for j in range(ow_n):
            w0, w1 = max(j * sw - pw, 0), min(j * sw - pw + kw, w_n)
            acc[:] = -127 if is_max else 0
            for y in range(h0, h1):
                for z in range(w0, w1):
                    for c in range(c_n):
                        v = np.int32(x[n, y, z, c])
                        if is_max:
                            acc[c] = max(acc[c], v)
                        else:
                            acc[c] += v
            count = max((h1 - h0) * (w1 - w0), 1)
            for c in range(c_n):
                if is_max:
                    out[n, i, j, c] = np.int8(acc[c])
                else:
                    q = abs(acc[c]) // count
                    out[n, i, j, c] = np.int8(q if acc[c] >= 0 else -q)


@njit(nogil=True, cache=True)
def concat_part(x, factor, s_out, requant, at, out, lo, hi):
    """Copies (P, Ci) x into out[:, at:at + Ci] (P, C), requantizing by factor / s_out when asked; items pixels."""
    c_n = x.shape[1]
    for p in range(lo, hi):
        for c in range(c_n):
            out[p, at + c] = f2i8(np.float32(x[p, c]) * factor / s_out) if requant else x[p, c]


@njit(nogil=True, cache=True)
def epilogue(acc, bias, scale, z, add_scale, low, top, relu_floor, add1, add2, out, lo, hi):
    """acc (P, O) int32 sums without bias -> out (P, O) int8 as qconv_reference, without branches (so that the loop
    vectorizes). The sums are added to the bias in float64, exact for any two int32s, then rounded once to float32
    as the reference's int64 sum is: the same value, and it vectorizes where AVX2 has no int64 -> float conversion
    (MobileNetV2's 112x112x96 sums: 1.21 -> 0.84 ns a value on one EPYC core; epilogue_add 0.97 -> 0.55). The caller
    turns the activation and fusion into per-channel terms (epilogue_terms). z (P, O) int8 is the fused add's input
    (when there is none, any int8 array of its size but `out`, which keeps the loop scalar: add1 = add2 = 0); items
    pixels. The per-channel operands are tiled (`tiled`): the loop runs flat over runs of whole pixels, not pixel by
    pixel, since a loop over a pixel's few channels (24, 32) is too short for LLVM's vector body."""
    o_n, run = acc.shape[1], bias.shape[0]
    af, zf, of = acc.reshape(-1), z.reshape(-1), out.reshape(-1)
    i, end = lo * o_n, hi * o_n
    while i < end:
        m = min(run, end - i)  # a multiple of o_n: every run starts at channel 0
        a, zz, oo = af[i:i + m], zf[i:i + m], of[i:i + m]
        for k in range(m):
            zs = np.float32(zz[k]) * add_scale[k]
            val = np.float32(np.float64(a[k]) + np.float64(bias[k])) * scale[k]
            val = max(val + zs * add1[k], relu_floor[k]) + zs * add2[k]
            oo[k] = min(max(f2i8(val), low[k]), top[k])
        i += m


@njit(nogil=True, cache=True)
def epilogue_add(acc, bias, scale, z, add_scale, out, lo, hi):
    """`epilogue` for the common fused case, an add before no activation (a residual block's 1x1 projection): the
    same arithmetic, 40% faster without the activation's terms; per-channel operands tiled as there."""
    o_n, run = acc.shape[1], bias.shape[0]
    af, zf, of = acc.reshape(-1), z.reshape(-1), out.reshape(-1)
    i, end = lo * o_n, hi * o_n
    while i < end:
        m = min(run, end - i)
        a, zz, oo = af[i:i + m], zf[i:i + m], of[i:i + m]
        for k in range(m):
            val = np.float32(np.float64(a[k]) + np.float64(bias[k])) * scale[k]
            oo[k] = f2i8(val + np.float32(zz[k]) * add_scale[k])
        i += m


# `job` (int64 words) of `epilogue_team`: OpenMP's two getters; 1 for `epilogue_add`, 0 for `epilogue`; the pixels P,
# channels O and the tiled operands' length; the addresses of acc (P, O) int32, bias int32, scale float32, z (P, O)
# int8, add_scale float32, low and top int8, relu_floor, add1 and add2 float32 (the last five unread by
# epilogue_add), out (P, O) int8.
(EPI_ADD, EPI_P, EPI_O, EPI_RUN, EPI_ACC, EPI_BIAS, EPI_SCALE, EPI_Z, EPI_ADD_SCALE, EPI_LOW, EPI_TOP, EPI_FLOOR,
 EPI_ADD1, EPI_ADD2, EPI_OUT, EPI_LEN) = range(2, 18)


@region
def epilogue_team(data):
    """One OpenMP thread's share of the pixels of an `epilogue` or `epilogue_add` call (see EPI_*); called outside a
    region, all of them (a native program's record of an int8 conv's int32 way)."""
    job, t, team = open_job(data, EPI_LEN)
    p, o, run = job[EPI_P], job[EPI_O], job[EPI_RUN]
    lo, hi = team_share(p, t, team)
    if lo >= hi:
        return
    acc, z = carray(i32_at(job[EPI_ACC]), (p, o)), carray(i8_at(job[EPI_Z]), (p, o))
    bias, scale = carray(i32_at(job[EPI_BIAS]), (run,)), carray(f32_at(job[EPI_SCALE]), (run,))
    add_scale, out = carray(f32_at(job[EPI_ADD_SCALE]), (run,)), carray(i8_at(job[EPI_OUT]), (p, o))
    if job[EPI_ADD]:
        epilogue_add(acc, bias, scale, z, add_scale, out, lo, hi)
        return
    epilogue(acc, bias, scale, z, add_scale, carray(i8_at(job[EPI_LOW]), (run,)), carray(i8_at(job[EPI_TOP]), (run,)),
             carray(f32_at(job[EPI_FLOOR]), (run,)), carray(f32_at(job[EPI_ADD1]), (run,)),
             carray(f32_at(job[EPI_ADD2]), (run,)), out, lo, hi)


RUN = 512  # elements of a flat epilogue run, about (`tiled`): whole pixels, long enough for the vector body


def tiled(channels: int, *per_channel: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each per-channel operand repeated over the pixels of one flat epilogue run (at least one pixel)."""
    reps = max(RUN // channels, 1)
    return tuple(np.ascontiguousarray(np.tile(a, reps)) for a in per_channel)


def epilogue_terms(o: int, act: int, fusion: int, relu6_max: np.ndarray) -> tuple[np.ndarray, ...]:
    """(low, top, relu_floor, add1, add2) per channel for `epilogue`: the int8 clamp (ReLU6: 0..ceiling), the
    float floor (ReLU: 0, else -inf), and where the fused add goes: before the activation, or after it (but not
    after a ReLU6, which TNN's kernels return from before that add)."""
    low = np.full(o, 0 if act == 2 else -128, np.int8)
    top = relu6_max.astype(np.int8) if act == 2 else np.full(o, 127, np.int8)
    floor = np.full(o, 0.0 if act == 1 else -np.inf, np.float32)
    add1 = np.full(o, 1.0 if fusion == 1 else 0.0, np.float32)
    add2 = np.full(o, 1.0 if fusion == 2 and act != 2 else 0.0, np.float32)
    return low, top, floor, add1, add2


@njit(nogil=True, cache=True, inline="always")
def _accumulate(x, w, acc, k, c0, n, oy, ox, geo):
    """`acc` plus output (n, oy, ox)'s int32 sum over weight row k, input channels from c0 (padding skipped)."""
    h_n, w_n = x.shape[1], x.shape[2]
    _, kh, kw, icg = w.shape
    sh, sw, dh, dw, pt, pl = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    for i in range(kh):
        iy = oy * sh - pt + i * dh
        if iy < 0 or iy >= h_n:
            continue
        for j in range(kw):
            ix = ox * sw - pl + j * dw
            if ix < 0 or ix >= w_n:
                continue
            for c in range(icg):
                acc += np.int32(w[k, i, j, c]) * np.int32(x[n, iy, ix, c0 + c])
    return acc


@njit(nogil=True, cache=True)
def conv_channels(x, w, bias, scale, z, add_scale, relu6_max, act, fusion, chans, geo, out, lo, hi):
    """Direct int8 convolution of the output channels `chans` only, on NHWC: x (N, H, W, C), w (len(chans), kh,
    kw, C/g) their weights, out (N, OH, OW, O), z like out when fused; geo = (sh, sw, dh, dw, pt, pl, groups).
    Exact int32 sums and the reference's requantization; items (n, oy)."""
    icg = w.shape[3]
    oh_n, ow_n = out.shape[1], out.shape[2]
    opg = out.shape[3] // geo[6]  # output channels per group
    for item in range(lo, hi):
        n, oy = item // oh_n, item % oh_n
        for ox in range(ow_n):
            for k in range(chans.shape[0]):
                o = chans[k]
                acc = _accumulate(x, w, np.int32(bias[o]), k, (o // opg) * icg, n, oy, ox, geo)
                zv = z[n, oy, ox, o] if fusion else np.int8(0)
                out[n, oy, ox, o] = requantize_one(acc, scale[o], zv, add_scale[o], relu6_max[o], act, fusion)


@njit(nogil=True, cache=True)
def fix_suspects(x, w, bias, scale, relu6_max, act, chans, table, geo, out, lo, hi):
    """Recomputes exactly (as conv_channels, w the rows of `chans`) the outputs of channels `chans` whose int8
    value oneDNN wrote is marked in their row of `table` (q + 128): where its rounding may differ from TNN's;
    items (n, oy)."""
    icg = w.shape[3]
    oh_n, ow_n = out.shape[1], out.shape[2]
    opg = out.shape[3] // geo[6]  # output channels per group
    for item in range(lo, hi):
        n, oy = item // oh_n, item % oh_n
        for ox in range(ow_n):
            for k in range(chans.shape[0]):
                o = chans[k]
                if not table[k, np.int32(out[n, oy, ox, o]) + 128]:
                    continue
                acc = _accumulate(x, w, np.int32(bias[o]), k, (o // opg) * icg, n, oy, ox, geo)
                out[n, oy, ox, o] = requantize_one(acc, scale[o], np.int8(0), ZERO, relu6_max[o], act, 0)
