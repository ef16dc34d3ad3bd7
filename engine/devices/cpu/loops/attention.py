"""numba loops of the fused attention kernel (engine/devices/cpu/attention.py): the online softmax of one tile of
scores, and the last step of a query block. float32 throughout; nothing is allocated.

A tile is s (rows, cols) = (scale * q_block) @ k_blockᵀ for query rows row0.. and keys col0..; `tile_softmax`
turns it in place into exp(s + mask - m) with m the running row max over every key block so far, rescales the
running sums l and the accumulator acc (the earlier blocks' p @ v) by exp(m_old - m_new), and folds the
previous block's product `pv` into acc first (so each block costs one call here and two GEMMs). `finish` then
writes (acc + pv) / l. A tile that holds every key (one block, `last`) is left unnormalised: its GEMM writes
the output directly and `scale_rows` divides the output rows by their sums (fewer elements than the tile).

The grouped path (short sequences, every key in one tile): `group_softmax` normalises the rows of a whole group of
heads in one call, the scale inside its exp, and `group_scale_rows` divides the product's rows. `attend_items`
runs a thread's whole share of the grouped path without the GIL: both GEMMs through cblas_sgemm around the same
softmax. cblas_sgemm is called from numba code on an address (blas.py's numpy_cblas finds it in numpy's OpenBLAS):
the call is emitted as LLVM IR on that address, so the compiled code does not bake the address in and stays
cacheable across processes; `wide` says whether the library's integers are 64-bit (ILP64, numpy's wheels) or 32.
(A change to that call in another file recompiles its cached callers here: numba_cache.py.)
`attend_team` is the same work as a native OpenMP region function (a cfunc taking one pointer, `job`): each thread
of the team runs the items of the chunks its thread number gives it, so a split grouped run never enters Python on
its threads (threads.run_native). OpenMP's thread number and count are read through their addresses, as the BLAS
call is made, so nothing process-specific is compiled in.

exp is a float32 polynomial (Cody-Waite reduction, degree-6 Taylor on [-ln2/2, ln2/2], 2^n built as exponent bits
and reinterpreted in a register, a scalar view: one pass, where an int32 scratch row took a second): LLVM
vectorises it, where math.exp is a scalar call per element (numba has no SVML
here): 0.8 ns against 17 ns per element; error below 7e-7 relative.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from engine.devices.cpu.loops.native import f32_at, i64_at, open_job, region, team_share

_JIT = {"nogil": True, "cache": True, "error_model": "numpy"}
_FAST = {"reassoc", "nsz", "contract", "afn"}  # no nnan/ninf: -inf scores and NaN rows must stay what they are
_F = np.float32
LOG2E, LN2_HI, LN2_LO = _F(1.4426950408889634), _F(0.693359375), _F(-2.12194440e-4)
EXP_MIN = _F(-87.0)  # below this exp is 0 (and 2^n stays a normal float)
C2, C3, C4, C5, C6 = _F(1 / 2), _F(1 / 6), _F(1 / 24), _F(1 / 120), _F(1 / 720)
MASK_NONE, MASK_ADD, MASK_BOOL = 0, 1, 2
NEG_INF = _F(-np.inf)
_I = np.int32
NEG_INF_ORDER = _I(-8388608 ^ 0x7FFFFFFF)  # -inf (bits 0xFF800000) as `_max` orders it: above every negative NaN
# Rows of up to this many keys go through group_softmax's flat form. Per element of a tile, one thread, AVX2 EPYC
# (row by row / flat, ns): 16 keys 4.5-5.1 / 2.3-2.9, 49 keys 1.6-2.3 / 1.2-2.0, 77 keys 1.5-2.0 / 0.9-1.6; 128
# keys and more alike or row by row ahead (512 keys 0.70 / 0.71-0.90).
FLAT_KEYS = 96


# -- cblas_sgemm from numba (see the module doc) --
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


def _call_of(bits: int):
    """An intrinsic calling cblas_sgemm at an address, with `bits`-wide integer arguments."""

    @intrinsic
    def call(typingctx, fn, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc):
        sig = types.void(fn, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc)

        def codegen(context, builder, signature, args):
            i32, wide, f32 = ir.IntType(32), ir.IntType(bits), ir.FloatType()
            ptr = ir.IntType(8).as_pointer()
            fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, wide, wide, wide, f32, ptr, wide, ptr, wide, f32,
                                                   ptr, wide])

            def integer(v):  # every integer argument arrives as int64 (the njit wrapper casts)
                return builder.trunc(v, wide) if bits < 64 else v

            f, tb, m_, n_, k_, al, a_, lda_, b_, ldb_, c_, ldc_ = args
            target = builder.inttoptr(f, fnty.as_pointer())
            builder.call(target, [ir.Constant(i32, ROW_MAJOR), ir.Constant(i32, NO_TRANS), builder.trunc(tb, i32),
                                  integer(m_), integer(n_), integer(k_), al, builder.inttoptr(a_, ptr),
                                  integer(lda_), builder.inttoptr(b_, ptr), integer(ldb_), ir.Constant(f32, 0.0),
                                  builder.inttoptr(c_, ptr), integer(ldc_)])
            return context.get_dummy_value()

        return sig, codegen

    return call


_sgemm64, _sgemm32 = _call_of(64), _call_of(32)


@njit(nogil=True, cache=True)
def sgemm(fn, wide, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc):
    """c (m x n, row stride ldc) = alpha * a (m x k) @ b (k x n; with trans_b, b is n x k and read transposed),
    row-major, every stride in elements; a, b and c are addresses. `fn` is cblas_sgemm's address, `wide` whether
    its integers are 64-bit."""
    tb = np.int64(TRANS if trans_b else NO_TRANS)
    args = (np.int64(m), np.int64(n), np.int64(k), np.float32(alpha), np.int64(a), np.int64(lda), np.int64(b),
            np.int64(ldb), np.int64(c), np.int64(ldc))
    if wide:
        _sgemm64(np.int64(fn), tb, *args)
    else:
        _sgemm32(np.int64(fn), tb, *args)


@njit(nogil=True, cache=True)
def address(a):
    """a.ctypes.data, for an array view made per run: 0.5 us here against 2-3 us through numpy's ctypes object."""
    return a.ctypes.data


@njit(nogil=True, cache=True)
def row_at(address, n):
    """The n float32 at `address` as a contiguous array view (a row written through an address by a GEMM)."""
    return carray(f32_at(np.int64(address)), (n,))


# -- the softmax loops --
@njit(fastmath=_FAST, inline="always", **_JIT)
def _exp(v):
    """exp(v) in float32, 0 below EXP_MIN; a NaN stays NaN. 2^n is built as exponent bits and reinterpreted in a
    register (a scalar view), so that a loop over it vectorises, where an int32 scratch row cost a second pass."""
    f = np.floor(v * LOG2E + _F(0.5))
    r = v - f * LN2_HI - f * LN2_LO
    p = _F(1.0) + r * (_F(1.0) + r * (C2 + r * (C3 + r * (C4 + r * (C5 + r * C6)))))
    bits = ((np.int32(f) + np.int32(127)) << 23) if v >= EXP_MIN else np.int32(0)
    return _F(0.0) if v < EXP_MIN else p * np.int32(bits).view(np.float32)


@njit(fastmath=_FAST, inline="always", **_JIT)
def _exp_row(x, n, scale, shift):
    """x[:n] = exp(scale * x[:n] - shift) in place (one FMA: a scale rides along for free); returns the sum."""
    s = _F(0.0)
    for j in range(n):
        y = _exp(x[j] * scale - shift)
        x[j] = y
        s += y
    return s


@njit(fastmath=_FAST, inline="always", **_JIT)
def _scale_mask(x, mask, mask_kind, scale, n):
    """x[:n] = scale * x[:n] + mask in place, or -inf where a bool mask forbids (no pass at all for no mask and a
    scale of 1)."""
    if mask_kind == MASK_ADD:
        for j in range(n):
            x[j] = x[j] * scale + _F(mask[j])
    elif mask_kind == MASK_BOOL:
        for j in range(n):
            x[j] = x[j] * scale if mask[j] else NEG_INF
    elif scale != 1:
        for j in range(n):
            x[j] *= scale


@njit(fastmath=_FAST, inline="always", **_JIT)
def _max(xi, n):
    """The largest of the float32 scores whose int32 bits are xi[:n] (-inf for n = 0). Each is mapped to an
    order-preserving int (a negative float's magnitude bits flipped) and the max taken over ints, which LLVM
    vectorises eight lanes wide; a float max it leaves scalar without the no-NaN flag, and an int max written
    without the int32 casts goes four int64 lanes wide. One thread, AVX2 EPYC, 64 rows: 0.13-0.15 against 0.32-0.38
    ns per element at 256 keys (eight float maxima in registers before), 0.39 against 0.71 at 64 keys.
    A NaN maps above +inf when its sign bit is clear (the max is NaN, and so is the caller's row, as it would be
    anyway), below -inf when it is set (skipped)."""
    low = _I(31)
    keep = _I(0x7FFFFFFF)
    m = NEG_INF_ORDER
    for j in range(n):
        v = xi[j]
        w = _I(v ^ _I(_I(v >> low) & keep))
        m = w if w > m else m
    return _I(m ^ _I(_I(m >> low) & keep)).view(np.float32)


@njit(fastmath=_FAST, **_JIT)
def tile_softmax(s, mask, mask_kind, causal, row0, col0, m, l, acc, pv, has_pv, last):
    """One key block of the online softmax over tile s, already scaled (see the module doc). `causal` forbids keys
    past the query (key index > query index, top-left aligned as torch). With `last` (the only block) the tile
    becomes exp(s - rowmax) and l its row sums, which `scale_rows` divides the product by."""
    rows, cols = s.shape
    si = s.view(np.int32)
    for i in range(rows):
        n = cols
        if causal:
            n = min(cols, max(0, row0 + i - col0 + 1))
            for j in range(n, cols):
                s[i, j] = _F(0.0)
        _scale_mask(s[i], mask[i], mask_kind, _F(1.0), n)
        mx = _max(si[i], n)
        m_old = NEG_INF if last else m[i]  # one block: no running state (m holds an earlier item's)
        m_new = max(m_old, mx)
        if m_new == NEG_INF:  # nothing to attend to so far, or only NaN scores of the sign _max skips
            nan = _F(0.0)
            for j in range(n):
                if s[i, j] != s[i, j]:  # a NaN score: the row's sum NaN from here on, its output NaN
                    nan = s[i, j]
                s[i, j] = _F(0.0)
            if last or nan != nan:
                l[i] = nan
            if not last and has_pv:
                for d in range(acc.shape[1]):
                    acc[i, d] += pv[i, d]
            continue
        total = _exp_row(s[i], n, _F(1.0), m_new)
        if last:
            l[i] = total
            continue
        alpha = _F(math.exp(m_old - m_new)) if m_old != NEG_INF else _F(0.0)
        l[i] = l[i] * alpha + total
        m[i] = m_new
        if has_pv:
            for d in range(acc.shape[1]):
                acc[i, d] = (acc[i, d] + pv[i, d]) * alpha
        else:
            for d in range(acc.shape[1]):
                acc[i, d] *= alpha


@njit(fastmath=_FAST, **_JIT)
def finish(acc, pv, l, out, nan_rows):
    """out = (acc + pv) / l per row; a row that attended to nothing is NaN (`nan_rows`) or zeros."""
    for i in range(out.shape[0]):
        if l[i] == _F(0.0):
            fill = _F(np.nan) if nan_rows else _F(0.0)
            for d in range(out.shape[1]):
                out[i, d] = fill
        else:  # a NaN sum (a NaN score) makes the row NaN
            inv = _F(1.0) / l[i]
            for d in range(out.shape[1]):
                out[i, d] = (acc[i, d] + pv[i, d]) * inv


@njit(fastmath=_FAST, **_JIT)
def scale_rows(out, l, nan_rows):
    """out /= l per row (one key block: the product of the unnormalised tile); rows with l = 0 as `finish`."""
    for i in range(out.shape[0]):
        _scale_row(out[i], l[i], nan_rows)


@njit(fastmath=_FAST, inline="always", **_JIT)
def _scale_row(x, total, nan_rows):
    """x /= total; a row with total 0 (nothing attended to) NaN (`nan_rows`) or zeros."""
    if total == _F(0.0):
        fill = _F(np.nan) if nan_rows else _F(0.0)
        for d in range(x.shape[0]):
            x[d] = fill
    else:
        inv = _F(1.0) / total
        for d in range(x.shape[0]):
            x[d] *= inv


@njit(**_JIT)
def reset(m, l, acc):
    for i in range(m.shape[0]):
        m[i] = NEG_INF
        l[i] = _F(0.0)
        for d in range(acc.shape[1]):
            acc[i, d] = _F(0.0)


@njit(fastmath=_FAST, **_JIT)
def group_softmax(s, mask, mask_kind, causal, row0, scale, l):
    """Softmax along the rows of each s[b, h] (queries, keys) = q @ kᵀ of a group of heads (of b batch items), every
    key in the tile: s becomes exp(scale * s + mask - row max), l[b, h] the row sums (`group_scale_rows` divides
    the product by them).
    Without a mask and with a positive scale the scale rides in the exp, exp(scale * (s - max)): a read-only max
    pass and the exp pass; else a first pass writes scale * s + mask. mask is (heads, queries, keys) as the node
    gives it; `causal` forbids key j for queries row0 + i < j (the queries a block of those from row0 on), whose
    scores become 0 for the product. A query with nothing to attend to gets l = 0; a NaN score makes its sum NaN.
    Row-wise, where the column-wise form (sᵀ, one running max and sum per query) read and wrote those per element:
    1.5-1.7x slower at 256 and 64 keys on an AVX2 EPYC (the max and sum vectorise here, see _max and _exp_row).
    Short rows (up to FLAT_KEYS, not causal) take a flat form: each row shifted by its max first, then one exp pass
    over the whole tile, then the row sums: a row of 77 keys left 13 exps to the vector loop's scalar remainder,
    most of the row's time."""
    fold = mask_kind == MASK_NONE and scale > 0
    si = s.view(np.int32)  # the scores' bits, for `_max`
    if causal or s.shape[3] > FLAT_KEYS:
        for b in range(s.shape[0]):
            for h in range(s.shape[1]):
                for i in range(s.shape[2]):
                    l[b, h, i] = _softmax_row(s[b, h, i], si[b, h, i], mask[b, h, i], mask_kind, causal, row0 + i,
                                              scale, fold)
        return
    for b in range(s.shape[0]):
        for h in range(s.shape[1]):
            for i in range(s.shape[2]):
                l[b, h, i] = _shift_row(s[b, h, i], si[b, h, i], mask[b, h, i], mask_kind, scale, fold)
    _exp_row(s.reshape(s.size), s.size, _F(1.0), _F(0.0))
    for b in range(s.shape[0]):
        for h in range(s.shape[1]):
            for i in range(s.shape[2]):
                l[b, h, i] += _sum(s[b, h, i])


@njit(fastmath=_FAST, inline="always", **_JIT)
def _shift_row(x, xi, mask, mask_kind, scale, fold):
    """One row of the flat form of `group_softmax` (xi: its bits): x = scale * x + mask - row max, what the exp
    pass then takes; returns what the row's sum starts from: 0, or for a row with nothing to attend to (every score
    -inf or NaN) NaN when it holds a NaN, the row then -inf so the exp pass leaves zeros."""
    n = x.shape[0]
    if not fold:
        _scale_mask(x, mask, mask_kind, scale, n)
    mx = _max(xi, n)
    if mx == NEG_INF or mx != mx:
        total = _F(0.0)
        for j in range(n):
            if x[j] != x[j]:
                total = x[j]
            x[j] = NEG_INF
        return total
    k = scale if fold else _F(1.0)
    shift = mx * k
    for j in range(n):
        x[j] = x[j] * k - shift
    return _F(0.0)


@njit(fastmath=_FAST, inline="always", **_JIT)
def _sum(x):
    s = _F(0.0)
    for j in range(x.shape[0]):
        s += x[j]
    return s


@njit(fastmath=_FAST, **_JIT)
def short_rows_softmax(x, out, lo, hi):
    """Softmax of rows [lo, hi) of x (rows, n) into out, for short rows (a detector's 2-4 classes): each row shifted
    by its max, then one exp pass over all those rows at once (`_exp_row`, vectorised across rows, where a row of 2
    leaves a row-wise exp to the vector loop's scalar remainder), then each row divided by its sum. IEEE arithmetic
    gives torch's special rows with no branch for them: a NaN entry is NaN after the exp and so is its row's sum; +inf
    as the max gives inf - inf = NaN; every entry -inf gives -inf - -inf = NaN; a -inf entry among finite ones
    gives 0. An entry more than 87 below its row's max gives 0 where float32 would keep a subnormal (below 1.7e-38).
    out may be x."""
    n = x.shape[1]
    for r in range(lo, hi):
        xr, orow = x[r], out[r]
        m = xr[0]
        for j in range(1, n):
            m = xr[j] if xr[j] > m else m
        for j in range(n):
            orow[j] = xr[j] - m
    flat = out[lo:hi].reshape((hi - lo) * n)
    _exp_row(flat, flat.shape[0], _F(1.0), _F(0.0))
    for r in range(lo, hi):
        orow = out[r]
        inv = _F(1.0) / _sum(orow)
        for j in range(n):
            orow[j] *= inv


@njit(fastmath=_FAST, **_JIT)
def long_rows_softmax(x, out, lo, hi):
    """Softmax of rows [lo, hi) of x (rows, n) into out row by row, for rows long enough to fill vectors alone:
    the row copied into out, its max (`_max`, over the int bits, vectorised), one exp pass that sums it
    (`_exp_row`), one scaling pass. Special rows as `short_rows_softmax`'s (a NaN or +inf entry, or every entry
    -inf, gives a NaN row). out may be x. (An exp pass from x into out, without the copy, was 4% faster on one
    thread of an Intel Xeon at (2364, 197), but its sums rounded differently in the last bit called from
    softmax_team's cfunc than from Python: a program's replay must give the Python path's numbers.)"""
    n = x.shape[1]
    for r in range(lo, hi):
        xr, orow = x[r], out[r]
        for j in range(n):
            orow[j] = xr[j]
        inv = _F(1.0) / _exp_row(orow, n, _F(1.0), _max(orow.view(np.int32), n))
        for j in range(n):
            orow[j] *= inv


# `job` (int64 words) of `softmax_team`: OpenMP's two getters (open_job); the rows and their length; the float32
# input and output (rows, n) addresses (out may be x); whether the rows take long_rows_softmax (else the short).
SM_ROWS, SM_N, SM_X, SM_OUT, SM_LONG, SM_LEN = range(2, 8)


@region
def softmax_team(data):
    """One OpenMP thread's share of the rows of a float32 softmax (see SM_*), as parallel_for would split them;
    called outside a region, all of them (a native program's record: devices/cpu/fused_calls.py)."""
    job, t, team = open_job(data, SM_LEN)
    rows, n = job[SM_ROWS], job[SM_N]
    lo, hi = team_share(rows, t, team)
    if lo >= hi:
        return
    x, out = carray(f32_at(job[SM_X]), (rows, n)), carray(f32_at(job[SM_OUT]), (rows, n))
    if job[SM_LONG] != 0:
        long_rows_softmax(x, out, lo, hi)
    else:
        short_rows_softmax(x, out, lo, hi)


@njit(fastmath=_FAST, inline="always", **_JIT)
def _softmax_row(x, xi, mask, mask_kind, causal, row, scale, fold):
    """One row of `group_softmax` (query `row`; xi: its bits); returns its sum."""
    cols = x.shape[0]
    n = min(cols, max(0, row + 1)) if causal else cols
    for j in range(n, cols):
        x[j] = _F(0.0)
    if not fold:
        _scale_mask(x, mask, mask_kind, scale, n)
    mx = _max(xi, n)
    if mx == NEG_INF:  # nothing to attend to (every score -inf), or every score a NaN of the sign _max skips
        total = _F(0.0)
        for j in range(n):
            if x[j] != x[j]:  # a NaN score: the row's sum, and so its output, NaN as the reference's
                total = x[j]
            x[j] = _F(0.0)
        return total
    k = scale if fold else _F(1.0)
    return _exp_row(x, n, k, mx * k)


@njit(fastmath=_FAST, **_JIT)
def group_scale_rows(out, l, nan_rows):
    """`scale_rows` over each matrix out[b, h] of a group of heads (of b batch items)."""
    for b in range(out.shape[0]):
        for h in range(out.shape[1]):
            scale_rows(out[b, h], l[b, h], nan_rows)


@njit(fastmath=_FAST, **_JIT)
def attend_items(gemm, wide, items, ptrs, strides, mask, mask_kind, causal, nan_rows, scale, S, e, dv, s, l):
    """The grouped path's items without the GIL: one call runs a thread's every item. items[i] = (first batch item
    o0, batch items nb, first head h0, heads nh, first query l0, queries L): per item s[b, h] = q @ kᵀ for each of
    its heads (cblas_sgemm at address `gemm`; `wide`: 64-bit integers), one softmax along the rows of the whole
    group (group_softmax: the scale, mask and causality included, as on the path from Python, so both give the same
    bits), out = s @ v per head, the division by the row sums.
    q, k, v and out are addresses ptrs[0..3] with byte strides strides[i] = (batch, head, row), unit-stride along
    their last axis; s and l are the thread's slot (room for nb x nh x L x S scores and nb x nh x L sums)."""
    for it in range(items.shape[0]):
        o0, nb, h0, nh, l0, L = items[it, 0], items[it, 1], items[it, 2], items[it, 3], items[it, 4], items[it, 5]
        t = s[:nb * nh * L * S].reshape(nb, nh, L, S)
        sums = l[:nb * nh * L].reshape(nb, nh, L)
        for b in range(nb):
            for h in range(nh):
                q = ptrs[0] + (o0 + b) * strides[0, 0] + (h0 + h) * strides[0, 1] + l0 * strides[0, 2]
                k = ptrs[1] + (o0 + b) * strides[1, 0] + (h0 + h) * strides[1, 1]
                sgemm(gemm, wide, True, L, S, e, _F(1.0), q, strides[0, 2] // 4, k, strides[1, 2] // 4,
                      t[b, h].ctypes.data, S)
        group_softmax(t, mask[o0:o0 + nb, h0:h0 + nh, l0:l0 + L], mask_kind, causal, l0, scale, sums)
        for b in range(nb):
            for h in range(nh):
                v = ptrs[2] + (o0 + b) * strides[2, 0] + (h0 + h) * strides[2, 1]
                o = ptrs[3] + (o0 + b) * strides[3, 0] + (h0 + h) * strides[3, 1] + l0 * strides[3, 2]
                sgemm(gemm, wide, False, L, dv, S, _F(1.0), t[b, h].ctypes.data, S, v, strides[2, 2] // 4, o,
                      strides[3, 2] // 4)
                for i in range(L):  # row by row: a 2-D view of an address is not unit-stride to LLVM (9x slower)
                    _scale_row(row_at(o + i * strides[3, 2], dv), sums[b, h, i], nan_rows)


# -- the grouped path as a native OpenMP region (see the module doc) --


# `job` (int64 words) of `attend_team`: addresses of OpenMP's omp_get_thread_num and omp_get_num_threads, of
# cblas_sgemm and whether its integers are 64-bit; the chunks (threads planned, each its own slot); the items of
# every chunk in one (rows, 6) table and where each chunk's rows start (chunks + 1 offsets); q, k, v, out addresses
# (4) and their byte strides (4, 3); the float32 mask's address, shape and byte strides (4-D, broadcast allowed); the
# mask kind, causal, NaN rows, the scale's float32 bits, S, e, dv; the slots' (s, l) addresses (chunks, 2) and the
# floats each holds.
(JOB_THREAD_NUM, JOB_NUM_THREADS, JOB_GEMM, JOB_WIDE, JOB_CHUNKS, JOB_TABLE, JOB_OFFSETS, JOB_PTRS, JOB_STRIDES,
 JOB_MASK) = range(10)
JOB_MASK_SHAPE, JOB_MASK_STRIDES = 10, 14
(JOB_KIND, JOB_CAUSAL, JOB_NAN_ROWS, JOB_SCALE, JOB_S, JOB_E, JOB_DV, JOB_SLOTS, JOB_S_LEN,
 JOB_L_LEN) = range(18, 28)
# Set (to 1) by a thread that found an item its slot cannot hold: the region function raises nothing (an exception in
# a cfunc is printed and dropped, the outputs left as they were), so it checks every item's sizes before
# attend_items runs it and the caller raises when the word is set.
JOB_ERROR = 28
JOB_LEN = 29


@region
def attend_team(data):
    """One OpenMP thread's share of a split grouped run: chunks t, t + T, ... of `job` (see JOB_*), each on its own
    slot, as `attend_items` runs them from Python (threads.run_native runs this on every thread of the team)."""
    job, t, team = open_job(data, JOB_LEN)
    chunks = job[JOB_CHUNKS]
    offsets = carray(i64_at(job[JOB_OFFSETS]), (chunks + 1,))
    table = carray(i64_at(job[JOB_TABLE]), (offsets[chunks], 6))
    ptrs = carray(i64_at(job[JOB_PTRS]), (4,))
    strides = carray(i64_at(job[JOB_STRIDES]), (4, 3))
    slots = carray(i64_at(job[JOB_SLOTS]), (chunks, 2))
    m = JOB_MASK_SHAPE
    mask = np.lib.stride_tricks.as_strided(
        carray(f32_at(job[JOB_MASK]), (1,)), shape=(job[m], job[m + 1], job[m + 2], job[m + 3]),
        strides=(job[m + 4], job[m + 5], job[m + 6], job[m + 7]))
    scale = np.int32(job[JOB_SCALE]).view(np.float32)
    for c in range(t, chunks, team):
        items = table[offsets[c]:offsets[c + 1]]
        for i in range(items.shape[0]):  # nb x nh x L scores and sums in the slot (see JOB_ERROR)
            rows = items[i, 1] * items[i, 3] * items[i, 5]
            if rows < 0 or rows > job[JOB_L_LEN] or rows * job[JOB_S] > job[JOB_S_LEN]:
                job[JOB_ERROR] = 1
                return
        attend_items(job[JOB_GEMM], job[JOB_WIDE] != 0, items, ptrs, strides, mask,
                     job[JOB_KIND], job[JOB_CAUSAL] != 0, job[JOB_NAN_ROWS] != 0, scale, job[JOB_S], job[JOB_E],
                     job[JOB_DV], carray(f32_at(slots[c, 0]), (job[JOB_S_LEN],)),
                     carray(f32_at(slots[c, 1]), (job[JOB_L_LEN],)))
