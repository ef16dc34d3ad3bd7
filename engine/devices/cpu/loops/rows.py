"""numba loops over the rows of 2-D/3-D views, split over items [lo, hi) by threads.parallel_for.

- row_sums: out[p] = scale * sum(x[p, :]) -- GlobalAvgPool and trailing-axes ReduceMean/ReduceSum on an
  (N*C, H*W) view. fastmath lets LLVM keep many partial sums in vector registers (numpy's pairwise float32
  sum over a row ran 5-7x slower); the error stays ~1e-7 relative, well inside float32 tolerances.
- rows_binary: out[p, q, r] = a[p, q, r] (op) s[p % s_rows, r] -- a binary op whose second operand is
  broadcast along the middle axis: the SE excitation (N, C, H, W) * (N, C, 1, 1) as (N*C, H*W, 1), or the same
  in the blocked layout (N, C/16, H, W, 16) * (N, C/16, 1, 1, 16) as (N*C/16, H*W, 16). numpy's broadcasting
  loop there runs an inner loop of 1 or 16 elements per call.
- flat_binary: out[i] = a[i] (op) b[i] over three flat arrays of one size; `binary_team` runs it or rows_binary as
  a native region function (a float32 Add/Sub/Mul/Div recorded into a native program: elementwise.py).
Each loop reads a[i] before writing out[i], so out may be a's buffer (in-place ops); it is then written
through a single array (no runtime alias check that would send LLVM to its scalar loop).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from engine.devices.cpu.loops.native import f32_at, i8_at, i64_at, open_job, region, team_share
from engine.devices.cpu.loops.pointwise import pass_share

_FAST = {"reassoc", "nsz", "contract"}  # reassociation for vectorised sums; no nnan/ninf (NaN must propagate)

ADD, SUB, MUL, DIV = 0, 1, 2, 3


@njit(nogil=True, cache=True, fastmath=_FAST)
def row_sums(x, out, scale, lo, hi):
    q = x.shape[1]
    for p in range(lo, hi):
        r = x[p]
        s = x.dtype.type(0)
        for k in range(q):
            s += r[k]
        out[p] = s * scale


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _apply(op, a, b):
    if op == ADD:
        return a + b
    if op == SUB:
        return a - b
    if op == MUL:
        return a * b
    return a / b


@njit(nogil=True, cache=True, error_model="numpy")
def _row_scalar(op, swap, r, o, v):
    """o = r (op) v, or v (op) r with swap."""
    if swap:
        for k in range(r.size):
            o[k] = _apply(op, v, r[k])
    else:
        for k in range(r.size):
            o[k] = _apply(op, r[k], v)


@njit(nogil=True, cache=True, error_model="numpy")
def _row_scalar_inplace(op, swap, o, v):
    if swap:
        for k in range(o.size):
            o[k] = _apply(op, v, o[k])
    else:
        for k in range(o.size):
            o[k] = _apply(op, o[k], v)


@njit(nogil=True, cache=True, error_model="numpy")
def _row_tiled(op, swap, r, o, tile):
    """o[k] = r[k] (op) tile[k % T] in chunks of T = tile.size (a multiple of R)."""
    t_n = tile.size
    for c0 in range(0, o.size, t_n):
        rc, oc = r[c0:c0 + t_n], o[c0:c0 + t_n]
        if swap:
            for k in range(oc.size):
                oc[k] = _apply(op, tile[k], rc[k])
        else:
            for k in range(oc.size):
                oc[k] = _apply(op, rc[k], tile[k])


@njit(nogil=True, cache=True, error_model="numpy")
def _row_tiled_inplace(op, swap, o, tile):
    t_n = tile.size
    for c0 in range(0, o.size, t_n):
        oc = o[c0:c0 + t_n]
        if swap:
            for k in range(oc.size):
                oc[k] = _apply(op, tile[k], oc[k])
        else:
            for k in range(oc.size):
                oc[k] = _apply(op, oc[k], tile[k])


@njit(nogil=True, cache=True, error_model="numpy")
def _rows_short(op, swap, a, s, out, lo, hi):
    """R = 1 with short rows (7x7 maps): one loop nest, no per-row helper call (~50 ns a row)."""
    s_rows = s.shape[0]
    for p in range(lo, hi):
        v = s[p % s_rows, 0]
        for k in range(a.shape[1]):
            out[p, k] = _apply(op, v, a[p, k]) if swap else _apply(op, a[p, k], v)


@njit(nogil=True, cache=True, error_model="numpy")
def rows_binary(a, s, out, op, swap, lo, hi):
    """a, out: (P, Q*R) C-contiguous rows; s: (S, R) with P a multiple of S. swap: s is the left operand.

    For R > 1 the row of s is first tiled into a scratch row of ~256 values: indexing s itself while storing
    into out, LLVM must assume the stores may change s and stays scalar (3-5x slower)."""
    s_rows, w = s.shape
    if w == 1 and a.shape[1] < 128:
        _rows_short(op, swap, a, s, out, lo, hi)
        return
    same = a.ctypes.data == out.ctypes.data
    tile = np.empty(w * max(1, min(a.shape[1] // w, 256 // w)) if w > 1 else 0, s.dtype)  # one per call
    for p in range(lo, hi):
        sr = s[p % s_rows]
        if w == 1:
            if same:
                _row_scalar_inplace(op, swap, out[p], sr[0])
            else:
                _row_scalar(op, swap, a[p], out[p], sr[0])
            continue
        for b in range(0, tile.size, w):
            tile[b:b + w] = sr
        if same:
            _row_tiled_inplace(op, swap, out[p], tile)
        else:
            _row_tiled(op, swap, a[p], out[p], tile)


@njit(nogil=True, cache=True)
def shuffle_rows(x, out, channels, groups, lo, hi):
    """ChannelShuffle on (N*C, H*W) rows: out channel j*groups + i is input channel i*(C/groups) + j.
    Items are (n, j) pairs, each copying its `groups` rows with 2-D indexing (row views and a division per row
    cost ~20 ns a row, as much as copying a 7x7 map)."""
    per_group = channels // groups
    hw = x.shape[1]
    for it in range(lo, hi):
        base = (it // per_group) * channels
        j = it % per_group
        for i in range(groups):
            s, d = base + i * per_group + j, base + j * groups + i
            for k in range(hw):
                out[d, k] = x[s, k]


@njit(nogil=True, cache=True)
def gather_rows(data, idx, out, lo, hi):
    """Gather along the middle axis: out[o, i, :] = data[o, idx[i], :] for items o * m + i in [lo, hi), with data
    (outer, dim, inner), idx (m,) already checked to lie in [-dim, dim) (negative ones count from the end), out
    (outer, m, inner). Reads only the rows it copies: the table is never copied whole."""
    m, dim = idx.shape[0], data.shape[1]
    for it in range(lo, hi):
        o, i = it // m, it % m
        k = idx[i]
        if k < 0:
            k += dim
        src, dst = data[o, k], out[o, i]
        for j in range(src.shape[0]):
            dst[j] = src[j]


# `job` (int64 words) of `copies_team`: OpenMP's two getters (open_job); the number of copies, the address of their
# (dst, src, bytes) int64 triples and the bytes of all of them.
CP_COUNT, CP_LIST, CP_TOTAL, CP_LEN = 2, 3, 4, 5
CP_ALIGN = 64  # shares are cut at multiples of 64 bytes of the copies' stream: two threads rarely write one line


@region
def copies_team(data):
    """Thread t's share of a list of copies (see CP_*): bytes [total * t / team, total * (t + 1) / team) of their
    concatenation, each cut down to a multiple of CP_ALIGN, so that the team copies every byte once whatever the
    copies' sizes (a concat of two inputs splits as well as one of twenty) and two threads share a cache line
    rarely. The copies must not overlap."""
    job, t, team = open_job(data, CP_LEN)
    count, total = job[CP_COUNT], job[CP_TOTAL]
    copies = carray(i64_at(job[CP_LIST]), (count, 3))
    lo = total * t // team // CP_ALIGN * CP_ALIGN
    hi = total if t == team - 1 else total * (t + 1) // team // CP_ALIGN * CP_ALIGN
    at = 0
    for k in range(count):
        size = copies[k, 2]
        a, b = max(lo - at, 0), min(hi - at, size)
        if a < b:
            dst, src = carray(i8_at(copies[k, 0] + a), (b - a,)), carray(i8_at(copies[k, 1] + a), (b - a,))
            for j in range(b - a):
                dst[j] = src[j]
        at += size


@njit(nogil=True, cache=True, error_model="numpy")
def flat_binary(a, b, out, op, lo, hi):
    """out[i] = a[i] (op) b[i] over [lo, hi) of three flat arrays of one size (out may be a's or b's buffer: each
    element is read before it is written). One loop per op, so that each vectorizes."""
    if op == ADD:
        for i in range(lo, hi):
            out[i] = a[i] + b[i]
    elif op == SUB:
        for i in range(lo, hi):
            out[i] = a[i] - b[i]
    elif op == MUL:
        for i in range(lo, hi):
            out[i] = a[i] * b[i]
    else:
        for i in range(lo, hi):
            out[i] = a[i] / b[i]


# `job` (int64 words) of `binary_team`: OpenMP's two getters; the op (ADD..DIV); whether it is `rows_binary`'s
# broadcast (else `flat_binary`'s same-shape op) and then its swap; rows P and a row's length (P * Q = the output's
# float32 values; P = 1 for the flat op); the broadcast operand's rows and row length; the float32 a's (the
# full-size operand), s's (the other) and out's addresses.
BIN_OP, BIN_ROWS, BIN_SWAP, BIN_P, BIN_Q, BIN_S, BIN_R, BIN_A, BIN_SMALL, BIN_OUT, BIN_LEN = range(2, 13)


@region
def binary_team(data):
    """One OpenMP thread's share of a float32 binary op (see BIN_*), as parallel_for splits it: rows of the
    broadcast op, or aligned runs of the flat one; called outside a region (a native program's OP_CALL), all of
    it."""
    job, t, team = open_job(data, BIN_LEN)
    p, q, op = job[BIN_P], job[BIN_Q], job[BIN_OP]
    a, out = carray(f32_at(job[BIN_A]), (p, q)), carray(f32_at(job[BIN_OUT]), (p, q))
    s = carray(f32_at(job[BIN_SMALL]), (job[BIN_S], job[BIN_R]))
    if job[BIN_ROWS] != 0:
        lo, hi = team_share(p, t, team)
        if lo < hi:
            rows_binary(a, s, out, op, job[BIN_SWAP] != 0, lo, hi)
        return
    n = p * q
    lo, hi = pass_share(n, t, team)  # a float32 pass's aligned shares
    if lo < hi:
        flat_binary(a.reshape(n), s.reshape(n), out.reshape(n), op, lo, hi)
