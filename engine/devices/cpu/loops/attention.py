"""numba loops of the fused attention kernel (engine/devices/cpu/attention.py): the online softmax of one tile of
scores, and the last step of a query block. float32 throughout; nothing is allocated.

A tile is s (rows, cols) = (scale * q_block) @ k_blockᵀ for query rows row0.. and keys col0..; `tile_softmax`
turns it in place into exp(s + mask - m) with m the running row max over every key block so far, rescales the
running sums l and the accumulator acc (the earlier blocks' p @ v) by exp(m_old - m_new), and folds the
previous block's product `pv` into acc first (so each block costs one call here and two GEMMs). `finish` then
writes (acc + pv) / l. A tile that holds every key (one block, `last`) is left unnormalised: its GEMM writes
the output directly and `scale_rows` divides the output rows by their sums (fewer elements than the tile).

The grouped path (short sequences, every key in one tile) holds sᵀ instead, keys by queries: `group_softmax_t`
normalises its columns for a whole group of heads in one call, `group_scale_rows` divides the product's rows.

exp is a float32 polynomial (Cody-Waite reduction, degree-6 Taylor on [-ln2/2, ln2/2], 2^n built as exponent bits
and reinterpreted in a register, a scalar view: one pass, where an int32 scratch row took a second): LLVM
vectorises it, where math.exp is a scalar call per element (numba has no SVML
here): 0.8 ns against 17 ns per element; error below 7e-7 relative.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

_JIT = {"nogil": True, "cache": True, "error_model": "numpy"}
_FAST = {"reassoc", "nsz", "contract", "afn"}  # no nnan/ninf: -inf scores and NaN rows must stay what they are
_F = np.float32
LOG2E, LN2_HI, LN2_LO = _F(1.4426950408889634), _F(0.693359375), _F(-2.12194440e-4)
EXP_MIN = _F(-87.0)  # below this exp is 0 (and 2^n stays a normal float)
C2, C3, C4, C5, C6 = _F(1 / 2), _F(1 / 6), _F(1 / 24), _F(1 / 120), _F(1 / 720)
MASK_NONE, MASK_ADD, MASK_BOOL = 0, 1, 2
NEG_INF = _F(-np.inf)


@njit(fastmath=_FAST, **_JIT)
def _exp_row(x, n, shift):
    """x[:n] = exp(x[:n] - shift) in place; returns the sum. One loop: 2^n is built as exponent bits and
    reinterpreted in a register (a scalar view), vectorised, where an int32 scratch row cost a second pass."""
    s = _F(0.0)
    for j in range(n):
        v = x[j] - shift
        f = np.floor(v * LOG2E + _F(0.5))
        r = v - f * LN2_HI - f * LN2_LO
        p = _F(1.0) + r * (_F(1.0) + r * (C2 + r * (C3 + r * (C4 + r * (C5 + r * C6)))))
        bits = ((np.int32(f) + np.int32(127)) << 23) if v >= EXP_MIN else np.int32(0)
        y = _F(0.0) if v < EXP_MIN else p * np.int32(bits).view(np.float32)  # a NaN score stays NaN (its sum too)
        x[j] = y
        s += y
    return s


@njit(fastmath=_FAST, **_JIT)
def _add_mask(x, mask, mask_kind, n):
    """x[:n] += mask in place, or -inf where a bool mask forbids."""
    if mask_kind == MASK_ADD:
        for j in range(n):
            x[j] += _F(mask[j])
    elif mask_kind == MASK_BOOL:
        for j in range(n):
            x[j] = x[j] if mask[j] else NEG_INF


@njit(fastmath=_FAST, **_JIT)
def _max(x, n):
    """max(x[:n]) (-inf for n = 0; NaNs skipped) through eight running maxima in registers: LLVM turns them into
    one vector max per eight elements, where it leaves a scalar max reduction scalar (and partial maxima kept in
    a scratch array went through memory: 0.48 against 0.23 ns per element)."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = NEG_INF
    j = 0
    while j + 8 <= n:
        v = x[j]
        a0 = v if v > a0 else a0
        v = x[j + 1]
        a1 = v if v > a1 else a1
        v = x[j + 2]
        a2 = v if v > a2 else a2
        v = x[j + 3]
        a3 = v if v > a3 else a3
        v = x[j + 4]
        a4 = v if v > a4 else a4
        v = x[j + 5]
        a5 = v if v > a5 else a5
        v = x[j + 6]
        a6 = v if v > a6 else a6
        v = x[j + 7]
        a7 = v if v > a7 else a7
        j += 8
    m = max(max(max(a0, a1), max(a2, a3)), max(max(a4, a5), max(a6, a7)))
    for k in range(j, n):
        m = x[k] if x[k] > m else m
    return m


@njit(fastmath=_FAST, **_JIT)
def tile_softmax(s, mask, mask_kind, causal, row0, col0, m, l, acc, pv, has_pv, last):
    """One key block of the online softmax over tile s, already scaled (see the module doc). `causal` forbids keys
    past the query (key index > query index, top-left aligned as torch). With `last` (the only block) the tile
    becomes exp(s - rowmax) and l its row sums, which `scale_rows` divides the product by."""
    rows, cols = s.shape
    for i in range(rows):
        n = cols
        if causal:
            n = min(cols, max(0, row0 + i - col0 + 1))
            for j in range(n, cols):
                s[i, j] = _F(0.0)
        _add_mask(s[i], mask[i], mask_kind, n)
        mx = _max(s[i], n)
        m_old = NEG_INF if last else m[i]  # one block: no running state (m holds an earlier item's)
        m_new = max(m_old, mx)
        if m_new == NEG_INF:  # nothing to attend to so far
            for j in range(n):
                s[i, j] = _F(0.0)
            if last:
                l[i] = _F(0.0)
            elif has_pv:
                for d in range(acc.shape[1]):
                    acc[i, d] += pv[i, d]
            continue
        total = _exp_row(s[i], n, m_new)
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
        if l[i] == _F(0.0):
            fill = _F(np.nan) if nan_rows else _F(0.0)
            for d in range(out.shape[1]):
                out[i, d] = fill
        else:
            inv = _F(1.0) / l[i]
            for d in range(out.shape[1]):
                out[i, d] *= inv


@njit(**_JIT)
def reset(m, l, acc):
    for i in range(m.shape[0]):
        m[i] = NEG_INF
        l[i] = _F(0.0)
        for d in range(acc.shape[1]):
            acc[i, d] = _F(0.0)



@njit(fastmath=_FAST, **_JIT)
def _scale_mask_max(row, mask, mask_kind, scale, m):
    """One key's row of sᵀ scaled and masked (one mask value per query), and the running column max m in the same
    pass. Every loop starts at 0 (a causal row comes as a slice): LLVM left a loop from a variable start
    unvectorised (2.5x slower)."""
    if mask_kind == MASK_ADD:
        for i in range(row.shape[0]):
            v = row[i] * scale + _F(mask[i])
            row[i] = v
            m[i] = v if v > m[i] else m[i]
    elif mask_kind == MASK_BOOL:
        for i in range(row.shape[0]):
            v = row[i] * scale if mask[i] else NEG_INF
            row[i] = v
            m[i] = v if v > m[i] else m[i]
    else:
        for i in range(row.shape[0]):
            v = row[i] * scale
            row[i] = v
            m[i] = v if v > m[i] else m[i]


@njit(fastmath=_FAST, **_JIT)
def group_softmax_t(s, mask, mask_kind, causal, row0, scale, m, l):
    """Softmax over the columns of each sᵀ[h] (keys, queries) = k @ qᵀ of a group of heads, every key in the tile:
    sᵀ becomes exp(scale * s + mask - column max), l[h] the column sums (`group_scale_rows` divides the product
    by them). Column-wise, each pass (scale and mask, max, exp, sum) runs along contiguous rows with one running
    value per query: vectorised, where a row-wise max and sum are reductions LLVM leaves scalar (3-4x slower).
    mask is (heads, queries, keys) as the node gives it; `causal` forbids key j for queries row0 + i < j (the
    queries a block of those from row0 on). A query with
    nothing to attend to gets l = 0; a NaN score makes its query's sum NaN. m is a scratch row (queries)."""
    keys, queries = s.shape[1], s.shape[2]
    for h in range(s.shape[0]):
        x, lh = s[h], l[h]
        for i in range(queries):
            m[i] = NEG_INF
        for j in range(keys):
            if causal:  # queries before key j do not see it
                lo = min(max(j - row0, 0), queries)
                x[j, :lo] = NEG_INF
                _scale_mask_max(x[j, lo:], mask[h, lo:, j], mask_kind, scale, m[lo:])
            elif mask_kind != MASK_NONE:
                _scale_mask_max(x[j], mask[h, :, j], mask_kind, scale, m)
            elif scale == 1:  # the common case inline (through the call: 1.4x slower), read only
                row = x[j]
                for i in range(queries):
                    m[i] = row[i] if row[i] > m[i] else m[i]
            else:
                row = x[j]
                for i in range(queries):
                    v = row[i] * scale
                    row[i] = v
                    m[i] = v if v > m[i] else m[i]
        for i in range(queries):
            lh[i] = _F(0.0)
            if m[i] == NEG_INF:  # nothing to attend to: every score of the column -inf, exp'd to 0 below
                m[i] = _F(0.0)
        for j in range(keys):
            row = x[j]
            for i in range(queries):
                v = row[i] - m[i]
                f = np.floor(v * LOG2E + _F(0.5))
                r = v - f * LN2_HI - f * LN2_LO
                p = _F(1.0) + r * (_F(1.0) + r * (C2 + r * (C3 + r * (C4 + r * (C5 + r * C6)))))
                bits = ((np.int32(f) + np.int32(127)) << 23) if v >= EXP_MIN else np.int32(0)
                y = _F(0.0) if v < EXP_MIN else p * np.int32(bits).view(np.float32)  # NaN stays NaN (its sum too)
                row[i] = y
                lh[i] += y


@njit(fastmath=_FAST, **_JIT)
def group_scale_rows(out, l, nan_rows):
    """`scale_rows` over each matrix out[h] of a group of heads."""
    for h in range(out.shape[0]):
        scale_rows(out[h], l[h], nan_rows)
