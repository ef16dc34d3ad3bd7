"""CPU kernel of Attention (engine/ops/attention.py): one fused pass over query blocks that never holds the
(…, L, S) scores, only one tile of them per thread (flash-attention's scheme).

float32: the work items are (batch and head, block of query rows); thread t takes items t, t + T, … (causal
blocks grow along the diagonal, so interleaving balances them). Per item, up to MAX_ONE_BLOCK keys the scores
of the block are one tile: s = q_blk @ kᵀ (BLAS), softmax in place with scale and mask (loops/attention.py),
out_blk = s @ v straight into the output. Beyond that the keys go by KEY_BLOCK with the online softmax: a
running row max and sum, the accumulated p @ v rescaled when the max grows, the output written once at the end.
A tile stays within TILE_BYTES (L2) so the two GEMMs and the softmax between them read it from cache; causal
items skip the key blocks past their last row. q, k, v and the output are read in place through their strides
(heads and batch may broadcast); the tiles live in the instance workspace, one slot per thread.
With oneDNN on, the two GEMMs of a tile run on its matmul primitive instead of BLAS (`_Tiles`: 20-25% faster
than OpenBLAS's sgemm on these shapes, 8-20% less CPU for the whole kernel at 1024-1500 keys): one primitive
per tile shape, created for one thread so it runs inline on whichever pool thread calls it, each slot with its own
runner (argument memories and scratchpad). Causal runs keep BLAS (their tiles take every key count).
Short sequences (one head's (L, S) scores within TILE_BYTES, as the small-headed attention of MobileViT and
EfficientFormer) take the grouped path instead: an item is a group of heads whose scores fit one tile together
(every head of several batch items when they fit), s = q @ kᵀ (one batched GEMM), softmax'd along its rows in one
numba call (scale and mask included), then out = s @ v; a few calls per group rather than eight per block of every
head (MobileViT-XXS's (4, 4, 16, 24) attention: 14 us of Python per head before).
With oneDNN on, heads of 256x256 scores and more (MobileViT-XXS's 256 tokens) run the group's two GEMMs as
oneDNN batched matmuls (`_GroupGemms`, 4 heads a call) instead of numpy's matmul, which calls OpenBLAS's sgemm head
by head (DNN_MIN_SCORES has the measurements); smaller heads keep numpy, where oneDNN's per-call cost loses.
Where numpy's BLAS is an OpenBLAS whose cblas_sgemm blas.numpy_cblas finds (numpy's wheels), the grouped path runs
without the GIL (`_run_items`, A.attend_items): each thread's items (a table of their spans, made once per run
shape) in one numba call that calls cblas_sgemm per head itself (loops/attention.py), so the threads never wait on
one another for the GIL between an item's calls, and a head's scores stay in cache between its two GEMMs and the
softmax. In-process A/B on the AVX2 EPYC (2 vCPUs; PackedAttention inputs as the models have them, CPU time at
batch 1, one thread / two): DeiT-tiny's 3 heads of 197 tokens 0.84x / 0.65x, ViT-B's 12 heads 0.87x / 0.84x,
Swin-T's 64 windows of 49 tokens 0.85x / 0.85x, MobileViT-XXS's 64- and 16-token ones 0.84-0.95x, 8 heads of 16
tokens 0.76x; whole models (bench/ab.py) DeiT-tiny 0.94x, BERT-base and DistilBERT 0.99x, MobileViT-XXS and
EfficientFormerV2 unchanged (bench/RESULTS.md, Attention without the GIL). Heads of 256x256 and more keep oneDNN's
batched GEMMs (`_GroupGemms`, faster at one thread there); operands the nogil path cannot hand to BLAS (more than
one batch axis before the heads, rows closer than their width or negative strides, a last axis not unit-stride, an
output shared between heads, anything but float32) keep the items dispatched from Python (`_GroupCall.nogil_plan`).
Split over OpenMP's team from Python, each thread still takes the GIL to start its numba call, in turn, and a thread
waiting for it sleeps: the second started 25-45 us after the first, and a split of MobileViT-XXS's 64-token
attention (0.16 ms on one thread) took 0.19-0.25 ms. Where the team spins through a request (Intel's OpenMP under
`run`, threads.native_regions) and the mask is float32 (or none), a split run is one native OpenMP region instead
(`_run_team`: A.attend_team, a numba cfunc reading its items from a table of words, `_TeamJob`), which no thread
enters Python for, and it splits from NATIVE_SPLIT_WORK.
When the threads do not divide its items (DeiT-tiny: 3 heads on 2 threads), the remainder runs as query ranges
(`tail_split`: the fewest that balance the threads as well as any), so each thread computes as many query rows.
Few keys (up to SHORT_KEYS) under many queries (windows over a feature map, cross-attention to text tokens) take
it too, one head and a block of queries per item, where rows that short would leave the row-wise loops mostly
per-row overhead.
Other float dtypes numba takes run the unfused path (the whole scores in the workspace); the rest (float16),
the reference.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from engine.devices.cpu.blas import numpy_cblas
from engine.devices.cpu.kernel import Backends, CpuKernel, empty, numba_ok, reference_fallback
from engine.devices.cpu.loops import attention as A
from engine.devices.cpu.loops.normalize import softmax_loop
from engine.devices.cpu.onednn import matmul as dnn
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.threads import (
    chunks_for,
    get_threads,
    native_regions,
    parallel_for,
    region_job,
    run_native,
)
from engine.errors import KernelError
from engine.ir import Node
from engine.ops import attention
from engine.ops.attention import causal_block, masked_fill, nan_rows, scale, shapes
from engine.ops.registry import TensorInfo
from engine.ops.rules import float_of

TILE_BYTES = 256 << 10  # scores per thread: in L2 on the machines measured (512 KiB-2 MiB per core)
MAX_ONE_BLOCK = 1024  # up to this many keys a query block's softmax is exact in one tile
KEY_BLOCK = 512  # keys per tile beyond that (online softmax)
MIN_ROWS, MAX_ROWS = 16, 128  # query rows per block: GEMMs large enough, tile within TILE_BYTES
# Beyond MAX_ONE_BLOCK keys, taller tiles: each key tile's K and V are streamed once per query block, and the
# acc rescale is per row, so 256 rows of 512 keys (512 KiB, still in L2) cost 9% less CPU than 128 rows at
# 4096x4096 (d40); short sequences keep 128 rows, so a few heads still split into enough items for the threads.
LONG_TILE_BYTES, LONG_MAX_ROWS = 512 << 10, 256
# Up to this many keys, queries whose scores outgrow a tile still go grouped (one head and a block of queries per
# item): a row of so few keys leaves the blocked path's per-block calls mostly overhead (4x49 heads of 3136 queries,
# Swin-like windows over a feature map: 5.6 -> 3.8 ms CPU with the grouped path's softmax column-wise, as fast
# row-wise; cross-attention to 77 tokens).
SHORT_KEYS = 256
# The grouped path's GEMMs on oneDNN (`_GroupGemms`) where a head's scores hold at least DNN_MIN_SCORES, in groups
# of up to DNN_TILE_BYTES. In-process A/B on an AVX2 EPYC (2 vCPUs, loaded; bench/attention_ab.py, CPU time,
# medians of 11 alternating rounds): MobileViT-XXS's 256-token attention (16 heads of 256x256, head dim 16) 0.83-0.87x
# of numpy's (OpenBLAS's) time at 1 and 2 threads, batch 1 and 8, with 4 heads (1 MiB of scores) a call; one head a
# call (the 256 KiB tile) 1.00-1.09x: oneDNN's gemm:jit is no faster than OpenBLAS per head on these shapes, the
# gain is fewer calls. Smaller heads lose to oneDNN's per-call cost: MobileViT's 16-token attention 1.8-2.1x, its
# 64-token one 0.97-1.13x; DeiT-tiny's 197 tokens (head dim 64) 0.91-1.05x, inside the noise. So only 256x256 up.
DNN_MIN_SCORES = 256 * 256
# The grouped path splits its items over the threads from this much work (queries x keys x (E + Ev) summed over
# the heads) on: below it the items' Python (the GIL) and the hand-over cost more than half the work saves (one
# layer, AVX2 EPYC, 2 threads against 1: 8 heads of 16 tokens, 262K, 2.3x slower split; of 64 tokens, 4.2M,
# 1.2-1.3x slower; 64 heads of 49 tokens d32, 9.8M, 0.76x).
GROUP_SPLIT_WORK = 1 << 23
# ... and over at most this many threads: its items are dispatched from Python, and past a few threads they wait
# for the GIL more than they compute (16-core Xeon, one layer, ms at 2 / 4 / 8 / 16 threads: 16 heads of 256
# tokens 0.91 / 0.83 / 1.15 / 2.50 and, another run, 1.58 / 1.00 / 1.55 / 2.88; DeiT-tiny's 3 heads of 197 tokens
# 0.52 / 0.54 / 0.78 / 1.87; bench/RESULTS.md, Many cores). The blocked path (long sequences) keeps every thread.
# The nogil path (below) removes that wait; the cap stays until it is measured on many cores again.
GROUP_MAX_THREADS = 4
# ... and from this much on where a split runs as one native OpenMP region on a spinning team (`_run_team`): no
# thread waits for the GIL or a wake-up there. One layer, one process per setting, 2 vCPUs (AMD EPYC Zen 4), ms,
# unsplit from Python / split natively: 16 heads of 64 tokens (d20, MobileViT-XXS's) 0.158-0.160 / 0.099, 8 of 64
# (d64) 0.166 / 0.106, 4 of 64 (d16, 524K) 0.10-0.12 / 0.05, 64 windows of 49 (d32) 0.34-0.37 / 0.25, 12 heads of
# 197 (d64) 0.94-1.09 / 0.87-0.92; 8 heads of 16 tokens (262K, the bound) 0.044 / 0.044-0.046.
NATIVE_SPLIT_WORK = 1 << 18
NOGIL = True  # the grouped path without the GIL where BLAS allows (False: Python's items, for tests and A/B runs)
DNN_TILE_BYTES = 1 << 20
_ALIGN = 64
_F32 = np.dtype(np.float32)


@dataclass(frozen=True)
class Blocking:
    rows: int  # query rows per block
    keys: int  # keys per tile
    e: int  # query / key width
    dv: int  # value width

    @property
    def slot_bytes(self) -> int:
        """One thread's buffers: the tile, the scaled query block, row max and sum, accumulator and block
        product."""
        parts = [self.rows * self.keys, self.rows * self.e, self.rows, self.rows, self.rows * self.dv,
                 self.rows * self.dv]
        return sum(_aligned(4 * p) for p in parts)


@dataclass(frozen=True)
class Grouping:
    """Short sequences: an item is a group of up to `heads` (rows, S) score matrices in one tile (see the module
    doc): every query of a head when its scores fit (heads of one batch item, or every head of several), else (few
    keys) blocks of `rows` queries of one head."""
    heads: int  # score matrices per slot
    rows: int  # queries per item
    S: int
    e: int

    @property
    def slot_bytes(self) -> int:
        """One thread's buffers: the group's scores and its query sums."""
        parts = [self.heads * self.rows * self.S, self.heads * self.rows]
        return sum(_aligned(4 * p) for p in parts)


def grouping(batch: tuple[int, ...], L: int, S: int, e: int, tile: int = TILE_BYTES) -> Grouping | None:
    """Score matrices per item when one head's scores fit a tile, as many as fit in `tile` bytes (heads, of several
    batch items when every head of one fits); one head and blocks of queries when they do not but the keys are few
    (up to SHORT_KEYS); else None: the blocked path. Which path is TILE_BYTES' choice whatever `tile` is."""
    L, S = max(1, L), max(1, S)
    one = 4 * L * S
    if S > MAX_ONE_BLOCK or (one > TILE_BYTES and S > SHORT_KEYS):
        return None
    if one > TILE_BYTES:
        return Grouping(1, min(L, max(MIN_ROWS, TILE_BYTES // (4 * S) // MIN_ROWS * MIN_ROWS)), S, e)
    return Grouping(max(1, min(math.prod(batch), tile // one)), L, S, e)


def heads_per_item(most: int, outer: int, heads: int, threads: int) -> int:
    """Up to `most` heads per item, fewer while that leaves a thread without an item."""
    g = max(1, min(most, heads))
    while g > 1 and outer * -(-heads // g) < threads:
        g = -(-g // 2)
    return g


def outer_per_item(most: int, outer: int, threads: int) -> int:
    """Up to `most` batch items (every head of each) per item, fewer while that leaves a thread without an item."""
    n = max(1, min(most, outer))
    while n > 1 and -(-outer // n) < threads:
        n = -(-n // 2)
    return n


@functools.lru_cache(maxsize=256)
def tail_split(items: int, threads: int, rows: int) -> tuple[int, int]:
    """(whole, parts) for `items` of `rows` queries each on `threads` threads: the first `whole` items run whole,
    each of the rest (the remainder the threads do not divide) as `parts` query ranges, the fewest ranges that
    leave the busiest thread (ranges go round the threads in turn) as few query rows as any split can.
    DeiT-tiny's 3 heads of 197 tokens on 2 threads: heads 0 and 1 whole, head 2 as two halves; one thread would
    otherwise take two heads (1.5x at best). Measured per thread (CPU time of its items, 2 threads): the busier one
    285 -> 225 us, the CPU of both +5%; halving every head instead (three items more, not one) came to 250 us at
    +14%. Each of the rest in `threads` ranges, as before, made rest x threads items where fewer balance as well:
    16 heads of 256 tokens on 12 threads, 48 ranges of 21 queries, each a few GEMM and numba calls under the GIL,
    7.8 ms on a 16-core Xeon against 0.9 on 2 threads (bench/RESULTS.md, Many cores); now 12 ranges of 85-86."""
    rest = items % threads if threads > 1 else 0
    if not rest:
        return items, 1
    # the busiest thread's ranges times a range's most rows, for 1 to `threads` ranges an item; ties: fewer
    busiest = [(-(-rest * p // threads) * -(-rows // p), p) for p in range(1, threads + 1)]
    parts = min(busiest)[1]
    return (items - rest, parts) if parts > 1 else (items, 1)


def even_rows(L: int, most: int) -> int:
    """Query rows per block for L queries in blocks of at most `most`: as few blocks as that allows, of sizes that
    differ by at most one row. Items interleave over the threads (thread t: items t, t + T, ...), so with blocks
    of `most` rows and a short last one every thread but one would get the full blocks: cross-attention of 1024
    queries to 77 keys (848 + 176 rows a head) ran 4.3 ms on one thread and 1.5 on the other, slower on two
    threads than on one (6.3 against 5.6 ms); in halves of 512, see bench/RESULTS.md."""
    L = max(1, L)
    return -(-L // -(-L // max(1, most)))


def blocking(L: int, S: int, e: int, dv: int) -> Blocking:
    if S <= MAX_ONE_BLOCK:
        keys, tile, most = max(1, S), TILE_BYTES, MAX_ROWS
    else:
        keys, tile, most = KEY_BLOCK, LONG_TILE_BYTES, LONG_MAX_ROWS
    rows = min(most, max(MIN_ROWS, tile // (4 * keys)))
    return Blocking(max(1, min(rows, L)), keys, e, dv)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class _Carver:
    """Consecutive float32 arrays, each starting on an _ALIGN boundary, carved from a workspace buffer."""

    def __init__(self, buf: np.ndarray):
        self.buf, self.off = buf, -buf.ctypes.data % _ALIGN

    def take(self, count: int) -> np.ndarray:
        a = self.buf[self.off:self.off + 4 * count].view(np.float32)
        self.off += _aligned(4 * count)
        return a


class _Slot:
    """One thread's buffers, carved from a workspace."""

    def __init__(self, buf: np.ndarray, b: Blocking):
        take = _Carver(buf).take
        self.s = take(b.rows * b.keys)
        self.q = take(b.rows * b.e).reshape(b.rows, b.e)
        self.m, self.l = take(b.rows), take(b.rows)
        self.acc, self.pv = take(b.rows * b.dv).reshape(b.rows, b.dv), take(b.rows * b.dv).reshape(b.rows, b.dv)
        self.s_ptr, self.q_ptr, self.pv_ptr = (a.ctypes.data for a in (self.s, self.q, self.pv))
        self.gemms: dict[tuple[int, int], tuple[dnn.Runner, dnn.Runner]] = {}  # this run's: (rows, keys) -> QK, PV
        self.runners: dict[tuple, tuple[dnn.Runner, dnn.Runner]] = {}  # every one made for this slot
        self.generation = 0  # the _Tiles generation its runners belong to (older ones are dropped)


class _GroupSlot:
    """One thread's buffers for a group of heads, carved from a workspace."""

    def __init__(self, buf: np.ndarray, g: Grouping):
        take = _Carver(buf).take
        self.s = take(g.heads * g.rows * g.S)
        self.l = take(g.heads * g.rows)
        self.s_ptr = self.s.ctypes.data
        self.gemms: dict[tuple[int, int, int], tuple[dnn.Runner, dnn.Runner]] | None = None  # this run's
        self.runners: dict[tuple, tuple[dnn.Runner, dnn.Runner]] = {}  # every one made for this slot
        self.generation = 0  # the _GroupGemms generation its runners belong to


def _fused_workspace(b: Blocking | Grouping) -> int:
    return get_threads() * b.slot_bytes + _ALIGN


def _workspace(backends: Backends, node: Node, ins: list[TensorInfo]) -> int:
    scores, out = shapes(node, ins)
    if _fused(ins):
        return _fused_workspace(_layout(scores, ins[0].shape[-1], out[-1], backends.onednn))
    return math.prod(scores) * float_of(ins[0].dtype).itemsize


def _layout(scores: tuple[int, ...], e: int, dv: int, onednn: bool) -> Blocking | Grouping:
    """Heads grouped in one tile when their scores fit (larger groups when their GEMMs go to oneDNN), else blocks
    of query rows."""
    L, S = scores[-2:]
    tile = DNN_TILE_BYTES if onednn and group_on_onednn(L, S) else TILE_BYTES
    return grouping(tuple(scores[:-2]), L, S, e, tile) or blocking(L, S, e, dv)


def group_on_onednn(L: int, S: int) -> bool:
    """Whether the grouped path's GEMMs of these (max) sizes go to oneDNN when it is on (DNN_MIN_SCORES)."""
    return L * S >= DNN_MIN_SCORES


def _fused(ins: list[TensorInfo]) -> bool:
    return all(np.dtype(i.dtype) == _F32 for i in ins[:3])


def build(backends: Backends, node: Node, ins: list[TensorInfo]):
    dt = float_of(ins[0].dtype)
    if _fused(ins):
        return _build_fused(node, ins, backends.onednn)
    if not numba_ok(dt):
        return reference_fallback(node, attention.reference)
    return _build_unfused(node, ins, dt)


class _Operands:
    """One run's q, k, v, mask and output, broadcast to the output's batch; its scale, causality and mask kind."""

    def __init__(self, node: Node, inputs, out: np.ndarray):
        q, k, v = (_last_axis_unit(a) for a in inputs[:3])
        self.node = node
        self.batch = out.shape[:-2]
        self.L, self.S = q.shape[-2], k.shape[-2]
        self.q, self.k, self.v = (_broadcast(a, self.batch) for a in (q, k, v))
        self.out = out
        self.scale = np.float32(scale(node, q.shape[-1]))
        self.causal = bool(node.params.get("is_causal", False))
        self.nan_rows = nan_rows(node)
        mask = inputs[3] if len(inputs) > 3 else None
        if mask is None:
            self.mask_kind, self.mask = A.MASK_NONE, None
        else:
            if mask.dtype != np.bool_ and mask.dtype not in (np.float32, np.float64):
                mask = mask.astype(np.float32)
            self.mask_kind = A.MASK_BOOL if mask.dtype == np.bool_ else A.MASK_ADD
            self.mask = np.broadcast_to(mask, self.batch + (self.L, self.S))

    def run_slots(self, lo: int, hi: int) -> None:
        """Thread t of [lo, hi) runs items t, t + T, ... on its own slot (self.slots, self.items, self.item: the
        subclass's)."""
        step = len(self.slots)
        for t in range(lo, hi):
            for item in range(t, self.items, step):
                self.item(self.slots[t], item)


class _Call(_Operands):
    """One run of the blocked path: items are (batch and head, block of query rows)."""

    def __init__(self, node: Node, inputs, out: np.ndarray, b: Blocking, slots: list[_Slot]):
        super().__init__(node, inputs, out)
        self.b, self.slots = b, slots
        self.rows = even_rows(self.L, b.rows)
        self.blocks = -(-self.L // self.rows)
        self.items = math.prod(self.batch) * self.blocks
        # k, v, q, out: batch strides and row stride in bytes, and (`_Tiles.prepare`, for the tile GEMMs on
        # oneDNN, which take addresses) base addresses: ndarray.ctypes.data costs ~2 us, so once per run
        self.arrays = (self.k, self.v, self.q, self.out)
        self.batch_strides = [a.strides[:-2] for a in self.arrays]
        self.row_strides = [a.strides[-2] for a in self.arrays]
        self.ptrs: list[int] = []

    def address(self, i: int, idx: tuple) -> int:
        """The address of k, v, q or out (i: 0-3) at batch index idx."""
        return self.ptrs[i] + sum(int(j) * st for j, st in zip(idx, self.batch_strides[i], strict=True))

    def tile_shapes(self) -> set[tuple[int, int]]:
        """The (query rows, keys) of every tile this run computes when not causal (at most four)."""
        rows = {min(self.rows, self.L), self.L % self.rows or self.rows} - {0}
        one = self.S <= self.b.keys
        keys = {self.S} if one else {self.b.keys, self.S % self.b.keys or self.b.keys}
        return {(r, n) for r in rows for n in keys}

    def item(self, slot: _Slot, item: int) -> None:
        bi, qb = divmod(item, self.blocks)
        idx = np.unravel_index(bi, self.batch) if self.batch else ()
        q, k, v, out = self.q[idx], self.k[idx], self.v[idx], self.out[idx]
        mask = self.mask[idx] if self.mask is not None else _NO_MASK
        l0 = qb * self.rows
        l1 = min(self.L, l0 + self.rows)
        r = l1 - l0
        kend = min(self.S, l1) if self.causal else self.S  # no row of the block sees a key past its last row
        qs = q[l0:l1]
        if self.scale != 1:
            qs = np.multiply(qs, self.scale, out=slot.q[:r])
        gemm = slot.gemms.get if slot.gemms else None
        if gemm:
            k_at, v_at, q_at, out_at = (self.address(i, idx) for i in range(4))
            q_at = slot.q_ptr if self.scale != 1 else q_at + l0 * self.row_strides[2]
        if kend <= self.b.keys:
            s = slot.s[:r * kend].reshape(r, kend)
            tile = gemm((r, kend)) if gemm else None
            if tile is None:
                np.matmul(qs, k[:kend].T, out=s)
            else:
                tile[0].run(q_at, k_at, slot.s_ptr)
            A.tile_softmax(s, mask[l0:l1, :kend], self.mask_kind, self.causal, l0, 0, slot.m, slot.l, slot.acc,
                           slot.pv, False, True)
            o = out[l0:l1]
            if tile is None:
                np.matmul(s, v[:kend], out=o)
            else:
                tile[1].run(slot.s_ptr, v_at, out_at + l0 * self.row_strides[3])
            A.scale_rows(o, slot.l, self.nan_rows)
            return
        A.reset(slot.m, slot.l, slot.acc)
        pv = slot.pv[:r]
        for s0 in range(0, kend, self.b.keys):
            s1 = min(kend, s0 + self.b.keys)
            n = s1 - s0
            s = slot.s[:r * n].reshape(r, n)
            tile = gemm((r, n)) if gemm else None
            if tile is None:
                np.matmul(qs, k[s0:s1].T, out=s)
            else:
                tile[0].run(q_at, k_at + s0 * self.row_strides[0], slot.s_ptr)
            A.tile_softmax(s, mask[l0:l1, s0:s1], self.mask_kind, self.causal, l0, s0, slot.m, slot.l, slot.acc,
                           pv, s0 > 0, False)
            if tile is None:
                np.matmul(s, v[s0:s1], out=pv)
            else:
                tile[1].run(slot.s_ptr, v_at + s0 * self.row_strides[1], slot.pv_ptr)
        A.finish(slot.acc[:r], pv, slot.l, out[l0:l1], self.nan_rows)


class _GroupCall(_Operands):
    """One run of the grouped path: items are (batch, group of heads, block of queries: every query unless the
    grouping splits them), every key of a head in one tile; where a tile holds every head of a batch item and more
    (and the batch is one axis), an item takes every head of several batch items. Per item: s = q @ kᵀ (one batched
    GEMM, kᵀ read in place), the softmax along its rows (one call, scale and mask included), out = s @ v and the
    division by the sums: four calls for the group, none per head. MobileViT-XXS's 64- and 16-token attentions ran
    4 items of 4 heads each at batch 1 (32 at batch 8), 15-30 us of Python apiece; as one item each, against main's
    kernel in the model (one thread): 64 tokens 0.88-0.91x (0.93-1.09x as four items), 16 tokens 0.72-0.79x."""

    def __init__(self, node: Node, inputs, out: np.ndarray, g: Grouping, slots: list[_GroupSlot], split: bool):
        super().__init__(node, inputs, out)
        if not self.batch:  # one matrix: a batch of one head
            self.batch = (1,)
            self.q, self.k, self.v, self.out = (a[None] for a in (self.q, self.k, self.v, self.out))
            self.mask = self.mask[None] if self.mask is not None else None
        if self.mask is None:
            self.mask = _no_mask(self.batch, max(1, self.L))
        self.slots = slots
        self.outer, self.heads = self.batch[:-1], self.batch[-1]
        outer = math.prod(self.outer)
        self.rows = even_rows(self.L, g.rows)
        self.blocks = -(-self.L // self.rows)
        self.per_item = 1  # batch items per item
        if g.heads >= 2 * self.heads and self.blocks == 1 and len(self.outer) == 1:
            self.per_item = outer_per_item(g.heads // self.heads, outer, len(slots))
        self.g = heads_per_item(g.heads, outer * self.blocks, self.heads, len(slots))
        self.groups = -(-self.heads // self.g)
        self.items = -(-outer // self.per_item) * self.groups * self.blocks
        self.whole, self.parts = tail_split(self.items, len(slots) if split else 1, self.rows)
        self.items = self.whole + (self.items - self.whole) * self.parts
        self.strides: list[tuple[int, ...]] = []  # q, k, v, out: byte strides and base addresses, when on oneDNN
        self.ptrs: list[int] = []

    def span(self, item: int) -> tuple[int, int, int, int, int, int] | None:
        """Item `item`'s (first batch item, batch items, first head, heads, first query, queries); None for a tail
        part that gets no query (fewer queries than parts)."""
        part = None
        if item >= self.whole:  # one of the `parts` query ranges of a tail item
            item, part = divmod(item - self.whole, self.parts)
            item += self.whole
        oi, gb = divmod(item, self.groups * self.blocks)
        gi, qb = divmod(gb, self.blocks)
        h0 = gi * self.g
        l0 = qb * self.rows
        l1 = min(self.L, l0 + self.rows)
        if part is not None:
            l0, l1 = l0 + part * (l1 - l0) // self.parts, l0 + (part + 1) * (l1 - l0) // self.parts
            if l0 == l1:  # fewer queries than parts
                return None
        o0 = oi * self.per_item if len(self.outer) == 1 else oi
        b = min(self.per_item, self.outer[0] - o0) if len(self.outer) == 1 else 1
        return o0, b, h0, min(self.heads, h0 + self.g) - h0, l0, l1 - l0

    def item(self, slot: _GroupSlot, item: int) -> None:
        span = self.span(item)
        if span is None:
            return
        o0, b, h0, n, l0, L = span
        S = self.S
        s = slot.s[:b * n * L * S].reshape(b, n, L, S)
        l = slot.l[:b * n * L].reshape(b, n, L)
        gemms = slot.gemms.get((b, n, L)) if slot.gemms else None
        heads = slice(h0, h0 + n)
        if len(self.outer) == 1:  # batch items o0 on: 4-D views
            at = (slice(o0, o0 + b), heads)
        else:  # one batch item, seen as a batch of one (None: a new axis)
            at = (*np.unravel_index(o0, self.outer), None, heads)
        # q, mask and output: this item's queries (a whole head's: no slice on the short path)
        qa = (*at, slice(l0, l0 + L)) if L < self.L else at
        if gemms is None:  # kᵀ read in place (BLAS takes the transposed operand by its strides)
            np.matmul(self.q[qa], self.k[at].swapaxes(-1, -2), out=s)
        else:
            k_at = self.address(1, o0, h0, 0)
            gemms[0].run(self.address(0, o0, h0, l0), k_at, slot.s_ptr)
        # the scale and mask in the softmax
        A.group_softmax(s, self.mask[qa], self.mask_kind, self.causal, l0, self.scale, l)
        o = self.out[qa]
        if gemms is None:
            np.matmul(s, self.v[at], out=o)
        else:
            gemms[1].run(slot.s_ptr, self.address(2, o0, h0, 0), self.address(3, o0, h0, l0))
        A.group_scale_rows(o, l, self.nan_rows)

    def signature(self) -> tuple:
        """What the nogil path's plan for this run depends on: the items and the operands' shapes and strides."""
        arrays = (self.q, self.k, self.v, self.out)
        return (self.batch, self.L, self.g, self.rows, self.per_item, self.whole, self.parts, self.items,
                len(self.slots), *(a.shape for a in arrays), *(a.strides for a in arrays))

    def nogil_plan(self) -> tuple[list[np.ndarray], np.ndarray] | None:
        """The nogil path's plan (A.attend_items): each thread's items, thread t taking items t, t + T, ... as
        run_slots does, as rows of their spans; and the (batch, head, row) byte strides of q, k, v and out. None
        when the operands do not suit it: more than one batch axis before the heads, a zero width, shapes that do
        not fit one another, an operand not native float32 (a kernel called directly, past the runtime's checks),
        strides BLAS cannot take (`_blas_strides`), or an output axis of more than one element with a zero
        stride."""
        q, k, v, out = self.q, self.k, self.v, self.out
        if len(self.outer) > 1 or q.shape[-1] == 0 or out.shape[-1] == 0:
            return None
        # BLAS reads float32 where the shapes say: anything else goes to numpy's matmul, which converts or refuses
        fits = (k.shape[-1] == q.shape[-1] and v.shape[-2] == self.S and out.shape[-2:] == (self.L, v.shape[-1])
                and all(a.shape[:-2] == self.batch and a.dtype == _F32 for a in (q, k, v, out)))
        strides = [_blas_strides(a) for a in (q, k, v, out)]
        shared = any(st == 0 and d > 1 for d, st in zip(out.shape[:-1], out.strides[:-1], strict=True))
        if not fits or shared or any(st is None for st in strides):  # shared: two heads or rows in one output row
            return None
        step = len(self.slots)
        spans = [self.span(item) for item in range(self.items)]
        table = [np.array([sp for sp in spans[t::step] if sp is not None], np.int64).reshape(-1, 6)
                 for t in range(step)]
        lead = 3 if len(self.outer) == 1 else 2  # heads only (one batch item): a zero batch stride
        return table, np.array([(0,) * (3 - lead) + st[-1 - lead:-1] for st in strides], np.int64)

    def addresses(self) -> np.ndarray:
        return np.array([A.address(self.q), A.address(self.k), A.address(self.v), A.address(self.out)], np.int64)

    def mask4(self) -> np.ndarray:
        """The mask (or its stand-in) as 4-D: (batch, heads, queries, keys)."""
        return self.mask if len(self.outer) == 1 else self.mask[None]

    def address(self, i: int, o: int, h: int, row: int) -> int:
        """The address of q, k, v or out (i: 0-3) at batch item o, head h, row `row` (4-D operands)."""
        st = self.strides[i]
        return self.ptrs[i] + o * st[0] + h * st[1] + row * st[2]

    def shapes(self) -> set[tuple[int, int, int]]:
        """The (batch items, heads, queries) of every item of this run."""
        return {s[1:4:2] + (s[5],) for s in map(self.span, range(self.items)) if s is not None}


class _Plans:
    """One-thread oneDNN matmul plans (dnn.ThreadPlan pairs) by key, made on the calling thread before the items run,
    and each slot's own Runners of them, so each pool thread runs its own. Past MAX_PLANS (shapes that keep
    changing) they start over: a new generation, and a slot whose runners are of an older one drops them when a run
    next uses it (a run uses only as many slots as there are threads, and a workspace of its own: the others keep
    theirs until then). Subclasses make a key's pair (`_make`, which stores it in `plans`)."""

    MAX_PLANS = 64

    def __init__(self):
        self.plans: dict[tuple, tuple[dnn.ThreadPlan, dnn.ThreadPlan]] = {}
        self.generation = 0

    def _room_for(self, count: int) -> bool:
        """Starts over when `count` more plans would pass MAX_PLANS; whether it did."""
        if len(self.plans) + count <= self.MAX_PLANS:
            return False
        self.plans.clear()
        self.generation += 1
        return True

    def _renew(self, slots: list) -> None:
        """Drops the runners of slots made in an older generation."""
        for slot in slots:
            if slot.generation != self.generation:
                slot.runners.clear()
                slot.generation = self.generation

    def _runners(self, slot, key: tuple) -> tuple[dnn.Runner, dnn.Runner]:
        runners = slot.runners.get(key)
        if runners is None:
            qk, pv = self.plans.get(key) or self._make(key)
            runners = slot.runners[key] = (qk.runner(), pv.runner())
        return runners

    def _make(self, key: tuple) -> tuple[dnn.ThreadPlan, dnn.ThreadPlan]:
        raise NotImplementedError


class _GroupGemms(_Plans):
    """The grouped path's two GEMMs (s = q @ kᵀ, out = s @ v over an item's batch items and heads) on oneDNN's
    batched matmul instead of numpy's matmul, which loops over the heads calling OpenBLAS's sgemm for each: one
    one-thread primitive (dnn.ThreadPlan) per item shape and operand strides, q, k, v and the output read and
    written in place through their strides (kᵀ a stride pattern). Only 4-D operands with no broadcast
    (zero-stride) axis; anything else keeps numpy."""

    def __init__(self):
        super().__init__()
        self.shapes: dict[tuple, tuple[tuple, ...]] = {}  # a run's signature -> its plan keys (item shapes)

    def prepare(self, call: _GroupCall) -> None:
        """Points every slot's `gemms` at this run's runners, by (batch items, heads, queries); none: numpy."""
        for slot in call.slots:
            slot.gemms = None
        arrays = (call.q, call.k, call.v, call.out)
        if len(call.outer) != 1 or not all(_strided_ok(a) for a in arrays) or call.L == 0:
            return
        call.strides = [a.strides for a in arrays]
        sig = (call.batch, call.L, call.S, call.q.shape[-1], call.out.shape[-1], *call.strides, call.items,
               call.whole, call.parts, len(call.slots))
        keys = self.shapes.get(sig)
        if keys is None:
            st = tuple(tuple(s // _F32.itemsize for s in strides) for strides in call.strides)
            keys = tuple((b, n, L, call.S, call.q.shape[-1], call.out.shape[-1], *st) for b, n, L in call.shapes())
            if self._room_for(len(keys)):
                self.shapes.clear()
            self.shapes[sig] = keys
        call.ptrs = call.addresses().tolist()
        self._renew(call.slots)
        for slot in call.slots:
            slot.gemms = {key[:3]: self._runners(slot, key) for key in keys}

    def _make(self, key: tuple) -> tuple[dnn.ThreadPlan, dnn.ThreadPlan]:
        b, n, L, S, e, dv, q, k, v, out = key
        s = (n * L * S, L * S, S, 1)
        made = self.plans[key] = (
            dnn.ThreadPlan(_md((b, n, L, e), q), _md((b, n, e, S), (k[0], k[1], 1, k[2])), _md((b, n, L, S), s)),
            dnn.ThreadPlan(_md((b, n, L, S), s), _md((b, n, S, dv), v), _md((b, n, L, dv), out)))
        return made


def _blas_strides(a: np.ndarray) -> tuple[int, ...] | None:
    """a's byte strides as the nogil path hands them to BLAS, or None when it cannot: unit stride along the last
    axis, a row stride of at least the row's width (BLAS's leading dimension), non-negative multiples of 4 before.
    An axis of one element may have any stride (numpy's broadcast gives 0), as it is never stepped along: the dense
    one stands in for the row and last axes, 0 for a batch or head axis."""
    st = list(a.strides)
    if a.shape[-1] == 1:
        st[-1] = 4
    if a.shape[-2] == 1:
        st[-2] = 4 * a.shape[-1]
    st[:-2] = [0 if d == 1 else x for d, x in zip(a.shape[:-2], st[:-2], strict=True)]
    if st[-1] != 4 or st[-2] < 4 * a.shape[-1] or any(x < 0 or x % 4 for x in st):
        return None
    return tuple(st)


def _strided_ok(a: np.ndarray) -> bool:
    """4-D float32, unit stride along the last axis, no broadcast (zero-stride) or negative stride elsewhere."""
    return (a.ndim == 4 and a.strides[-1] == _F32.itemsize
            and all(st > 0 and st % _F32.itemsize == 0 or d == 1 for d, st in zip(a.shape, a.strides, strict=True)))


def _md(shape: tuple[int, ...], strides: tuple[int, ...]) -> D.MemoryDesc:
    """A descriptor of `shape` with element `strides`, a size-1 axis given the dense stride (its stride does not
    matter to the data; oneDNN then sees the dense layout it has kernels for)."""
    st = list(strides)
    for i in range(len(shape) - 2, -1, -1):
        if shape[i] == 1:
            st[i] = st[i + 1] * shape[i + 1]
    return D.MemoryDesc.strided(shape, st)


class _Tiles(_Plans):
    """The blocked path's tile GEMMs on oneDNN's matmul (plans per tile shape and strides, `_Plans`). Causal runs
    (tiles of every key count up to the diagonal) and an output without unit stride along its last axis keep
    BLAS."""

    def prepare(self, call: _Call) -> None:
        """Points every slot's `gemms` at this run's runners (none: the slots run BLAS)."""
        use = (not call.causal and call.out.strides[-1] == _F32.itemsize and call.S > 0 and call.L > 0
               and min(call.row_strides) > 0)
        shapes = call.tile_shapes() if use else set()
        if shapes:
            call.ptrs = [a.ctypes.data for a in call.arrays]
        e, dv, one = call.q.shape[-1], call.out.shape[-1], call.S <= call.b.keys
        k_row, v_row, q_row, out_row = (st // _F32.itemsize for st in call.row_strides)
        q_row = e if call.scale != 1 else q_row  # the scaled block sits in the slot
        self._room_for(len(shapes))
        self._renew(call.slots)
        keys = {(r, n): (r, n, e, dv, q_row, k_row, v_row, out_row if one else dv) for r, n in shapes}
        for slot in call.slots:
            slot.gemms = {rn: self._runners(slot, key) for rn, key in keys.items()}

    def _make(self, key: tuple) -> tuple[dnn.ThreadPlan, dnn.ThreadPlan]:
        r, n, e, dv, q_row, k_row, v_row, pv_row = key
        made = self.plans[key] = (dnn.ThreadPlan.strided(r, e, n, (q_row, 1), (1, k_row), (n, 1)),
                                  dnn.ThreadPlan.strided(r, n, dv, (n, 1), (v_row, 1), (pv_row, 1)))
        return made


# MASK_NONE's stand-in: indexed by row only, never read; a broadcast view (read-only, strided) like real masks
_NO_MASK = np.broadcast_to(np.zeros((1, 1), np.float32), (1 << 40, 2))[:, :1]


def _broadcast(a: np.ndarray, batch: tuple[int, ...]) -> np.ndarray:
    """`a` over the output's batch (a view; np.broadcast_to only when it differs: it costs ~4 us a call)."""
    return a if a.shape[:-2] == batch else np.broadcast_to(a, batch + a.shape[-2:])


@functools.lru_cache(maxsize=64)
def _no_mask(batch: tuple[int, ...], L: int) -> np.ndarray:
    """The grouped path's MASK_NONE stand-in for this batch and query count (never read), made once."""
    return np.broadcast_to(_NO_MASK[:1, :1], batch + (L, 1))


def _last_axis_unit(a: np.ndarray) -> np.ndarray:
    """`a` with unit stride along its last axis (what BLAS reads in place); a copy only when it has not."""
    return a if a.strides[-1] == a.itemsize or a.shape[-1] <= 1 else np.ascontiguousarray(a)


def _build_fused(node: Node, ins: list[TensorInfo], onednn: bool):
    scores_max, out_max = shapes(node, ins)
    b = _layout(scores_max, ins[0].shape[-1], out_max[-1], onednn)
    grouped = isinstance(b, Grouping)
    tiles: _Tiles | _GroupGemms | None = None
    if onednn:
        tiles = _Tiles() if not grouped else _GroupGemms() if group_on_onednn(*scores_max[-2:]) else None
    slot_of = _GroupSlot if grouped else _Slot
    cblas = numpy_cblas() if grouped and tiles is None and NOGIL else None  # 256x256 heads up: oneDNN's batched GEMMs
    _compile_group(b, _mask_dtype(ins), cblas) if grouped else _compile(b)
    plans: dict[tuple, tuple | None] = {}  # a run's signature -> its nogil plan (None: the operands do not suit it)
    teams: dict[tuple, _TeamJob] = {}  # a split run's signature and slots -> its native region's job
    cache: dict[int, tuple[np.ndarray, list]] = {}  # workspace address -> its slots
    last: list = [None, None]  # the last workspace object and its slots: the runtime passes the same one each run
    private: list[np.ndarray] = []

    def slots_in(workspace: np.ndarray | None) -> list:
        if workspace is not None and workspace is last[0]:
            return last[1]
        given = workspace
        need = _fused_workspace(b)
        if workspace is None or workspace.nbytes < need:  # direct use outside the runtime
            if not private:
                private.append(np.empty(need, np.uint8))
            workspace = private[0]
        buf = workspace.reshape(-1).view(np.uint8)
        hit = cache.get(buf.ctypes.data)
        if hit is None or hit[0].nbytes != buf.nbytes:
            count = (buf.nbytes - _ALIGN) // b.slot_bytes
            hit = cache[buf.ctypes.data] = (buf, [slot_of(buf[i * b.slot_bytes:], b) for i in range(count)])
        last[:] = given, hit[1]
        return hit[1]

    # the last run's key, its arrays (held until the next run: a graph input or handed-out output at most, as
    # conv/onednn.py's BoundRuns holds), and the thunk that ran it
    repeat: list = [None, None, None]

    def run(inputs, outputs, workspace):
        out = outputs[0]
        key = (tuple(map(id, inputs)), id(out), id(workspace), get_threads(), native_regions())
        last_key, _, again_last = repeat  # one read: an instance runs on one thread at a time (its lock)
        if key == last_key:
            again_last()
            return
        repeat[:] = [None, None, None]
        slots = slots_in(workspace)[:max(1, get_threads())]
        L, S = inputs[0].shape[-2], inputs[1].shape[-2]
        rows = min(b.rows, max(1, L)) if grouped else b.rows
        work = math.prod(out.shape[:-2]) * -(-L // rows) * rows * S * (inputs[0].shape[-1] + out.shape[-1])
        native = cblas is not None and _native_mask(inputs) and native_regions()
        if grouped:  # split: whether parallel_for hands items to other threads (else one slot, the largest items)
            slots = slots[:GROUP_MAX_THREADS]
            split = work >= (NATIVE_SPLIT_WORK if native else GROUP_SPLIT_WORK) and chunks_for(len(slots), work) > 1
            slots = slots if split else slots[:1]
            call = _GroupCall(node, inputs, out, b, slots, split)
        else:
            call = _Call(node, inputs, out, b, slots)
        if call.S == 0 or call.items == 0:
            out.fill(np.nan if call.nan_rows else 0.0)
            return
        if cblas is not None:  # grouped: the nogil path, when the operands suit it
            sig = call.signature()
            plan = plans.get(sig, False)
            if plan is False:
                if len(plans) >= 64:
                    plans.clear()
                plan = plans[sig] = call.nogil_plan()
            if plan is not None:
                args = (call, *cblas, *plan, call.addresses(), call.mask4())

                def again() -> None:
                    if split and native and _run_team(call, sig, cblas, plan, teams):
                        return
                    parallel_for(_run_items, len(slots), work, *args)
                if _views_only(inputs):
                    repeat[:] = [key, (tuple(inputs), out, workspace), again]
                again()
                return
        if tiles is not None:
            tiles.prepare(call)
        parallel_for(call.run_slots, len(slots), work)

    run.impl = "fused-attention"  # type: ignore[attr-defined]
    return run


def _views_only(inputs) -> bool:
    """Whether a run's call holds views of its inputs alone, no copy (`_last_axis_unit`'s of a strided operand, a
    mask converted to float32): then a run on the very same array objects (the runtime's arena views and held
    request arrays, run after run) may run the last call again (`repeat` in `_build_fused`: ~15 us of Python a
    small attention), since a view sees the new contents where a copy would keep the old ones."""
    qkv_unit = all(a.strides[-1] == a.itemsize or a.shape[-1] <= 1 for a in inputs[:3])
    mask = inputs[3] if len(inputs) > 3 else None
    return qkv_unit and (mask is None or mask.dtype in (np.bool_, np.float32, np.float64))


def _native_mask(inputs) -> bool:
    """Whether the mask (if any) is one `attend_team` is compiled for: float32."""
    return len(inputs) < 4 or inputs[3] is None or inputs[3].dtype == _F32


class _TeamJob:
    """The `job` words of A.attend_team for one plan and set of slots (loops/attention.py, JOB_*), and the arrays
    they point at (kept alive here); `run` fills in the run's operand and mask addresses."""

    def __init__(self, call: _GroupCall, cblas: tuple[int, bool], table: list[np.ndarray], strides: np.ndarray):
        self.table = np.ascontiguousarray(np.concatenate(table).reshape(-1, 6), np.int64)
        self.offsets = np.cumsum([0] + [len(t) for t in table], dtype=np.int64)
        self.strides = np.ascontiguousarray(strides, np.int64)
        self.ptrs = np.zeros(4, np.int64)
        self.slots = np.array([(A.address(sl.s), A.address(sl.l)) for sl in call.slots], np.int64)
        job = self.job = region_job(A.JOB_LEN)
        job[A.JOB_GEMM], job[A.JOB_WIDE] = cblas[0], int(cblas[1])
        job[A.JOB_CHUNKS] = len(table)
        for at, a in ((A.JOB_TABLE, self.table), (A.JOB_OFFSETS, self.offsets), (A.JOB_PTRS, self.ptrs),
                      (A.JOB_STRIDES, self.strides), (A.JOB_SLOTS, self.slots)):
            job[at] = A.address(a)
        job[A.JOB_KIND], job[A.JOB_CAUSAL], job[A.JOB_NAN_ROWS] = call.mask_kind, call.causal, call.nan_rows
        job[A.JOB_SCALE] = np.float32(call.scale).view(np.int32)
        job[A.JOB_S], job[A.JOB_E], job[A.JOB_DV] = call.S, call.q.shape[-1], call.out.shape[-1]
        job[A.JOB_S_LEN], job[A.JOB_L_LEN] = min(sl.s.size for sl in call.slots), min(sl.l.size for sl in call.slots)

    def run(self, call: _GroupCall, mask: np.ndarray) -> bool:
        """The run on OpenMP's team without the GIL (`mask`: call.mask4()); False (nothing run) when the team is
        taken."""
        self.ptrs[:] = call.addresses()
        job = self.job
        job[A.JOB_MASK] = A.address(mask)
        job[A.JOB_MASK_SHAPE:A.JOB_MASK_SHAPE + 4] = mask.shape
        job[A.JOB_MASK_STRIDES:A.JOB_MASK_STRIDES + 4] = mask.strides
        job[A.JOB_ERROR] = 0
        if not run_native(A.attend_team().address, self.job):
            return False
        if job[A.JOB_ERROR]:
            raise KernelError(f"{call.node.where()}: an attention item outgrew its slot in the workspace "
                              f"(scores {job[A.JOB_S_LEN]}, sums {job[A.JOB_L_LEN]}); its output was not written")
        return True


def _run_team(call: _GroupCall, sig: tuple, cblas: tuple[int, bool], plan: tuple, teams: dict) -> bool:
    """A split grouped run as one native OpenMP region (A.attend_team) when the mask is float32 (the stand-in
    included); False when it did not run (another mask dtype, the team taken)."""
    mask = call.mask4()
    if mask.dtype != _F32 or mask.ndim != 4:
        return False
    key = (sig, call.mask_kind, tuple(A.address(sl.s) for sl in call.slots))  # sig: call.signature()
    job = teams.get(key)
    if job is None:
        if len(teams) >= 64:
            teams.clear()
        job = teams[key] = _TeamJob(call, cblas, *plan)
    return job.run(call, mask)


def _run_items(call: _GroupCall, gemm: int, wide: bool, table: list[np.ndarray], strides: np.ndarray,
               ptrs: np.ndarray, mask: np.ndarray, lo: int, hi: int) -> None:
    """Threads lo..hi - 1 of a grouped run on the nogil path: each its items in one call (gemm, wide: the
    cblas_sgemm blas.numpy_cblas found)."""
    e, dv = call.q.shape[-1], call.out.shape[-1]
    for t in range(lo, hi):
        slot = call.slots[t]
        A.attend_items(gemm, wide, table[t], ptrs, strides, mask, call.mask_kind, call.causal, call.nan_rows,
                       call.scale, call.S, e, dv, slot.s, slot.l)


def _compile(b: Blocking) -> None:
    """Compiles (or loads) the tile loops now, not on the first request."""
    slot = _Slot(np.empty(b.slot_bytes + _ALIGN, np.uint8), b)
    s = slot.s[:0].reshape(0, 1)
    for mask, kind in ((_NO_MASK[:0], A.MASK_NONE), (_NO_MASK[:0], A.MASK_ADD)):
        A.tile_softmax(s, mask, kind, False, 0, 0, slot.m, slot.l, slot.acc, slot.pv, False, True)
    A.finish(slot.acc[:0], slot.pv[:0], slot.l, slot.acc[:0], False)
    A.scale_rows(slot.acc[:0], slot.l, False)
    A.reset(slot.m[:0], slot.l[:0], slot.acc[:0])


def _mask_dtype(ins: list[TensorInfo]) -> np.dtype:
    """The dtype a run hands the loops its mask in (_Operands: bool and float64 as given, anything else float32;
    no mask: the float32 stand-in)."""
    dt = np.dtype(ins[3].dtype) if len(ins) > 3 else _F32
    return dt if dt in (np.dtype(np.bool_), np.dtype(np.float64)) else _F32


def _compile_group(g: Grouping, mask_dtype: np.dtype, cblas: tuple[int, bool] | None) -> None:
    """The grouped path's loops, as `_compile`, for the types a run passes: a broadcast (strided) mask of the node's
    mask dtype (and the float32 stand-in), a contiguous output; and the nogil path's when it runs (`cblas`). A numba
    loop compiles on its first call with new argument types: here, not in a request (a few seconds the first time, then
    from numba's cache)."""
    slot = _GroupSlot(np.empty(g.slot_bytes + _ALIGN, np.uint8), g)
    s, l = slot.s[:0].reshape(1, 1, 0, 1), slot.l[:0].reshape(1, 1, 0)
    masks = {_F32: A.MASK_ADD, mask_dtype: A.MASK_BOOL if mask_dtype == np.bool_ else A.MASK_ADD}
    for dt, kind in masks.items():
        mask = np.broadcast_to(np.zeros((1, 1), dt), (1, 1, 2, 1))
        for k in {A.MASK_NONE, kind}:
            A.group_softmax(s, mask, k, False, 0, np.float32(1), l)
        if cblas is not None:  # no item: nothing is called
            gemm, wide = cblas
            A.attend_team()  # the native split's region function (`_run_team`)
            none, zeros = np.zeros((0, 6), np.int64), np.zeros((4, 3), np.int64)
            A.attend_items(gemm, wide, none, zeros[:, 0].copy(), zeros, mask, kind, False, False, np.float32(1), 1, 1,
                           1, slot.s, slot.l)
    A.group_scale_rows(s, l, False)


def _build_unfused(node: Node, ins: list[TensorInfo], dt: np.dtype):
    """Two matmuls around a numba softmax, the (…, L, S) scores in the workspace (float64 and integer inputs)."""
    scores_max, _ = shapes(node, ins)
    blocked = causal_block(*scores_max[-2:]) if node.params.get("is_causal") else None
    softmax_loop(empty(3, dt), empty(3, dt), False, True)
    empty_is_zero = not nan_rows(node)

    def run(inputs, outputs, workspace):
        q, k, v = inputs[:3]
        mask = inputs[3] if len(inputs) > 3 else None
        batch = q.shape[:-2] if q.shape[:-2] == k.shape[:-2] else np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        shape = (*batch, q.shape[-2], k.shape[-2])
        scores = _scratch(workspace, shape, dt)
        np.matmul(q, np.swapaxes(k, -1, -2), out=scores, casting="unsafe")
        scores *= dt.type(scale(node, q.shape[-1]))
        masked_fill(scores, mask, blocked)
        view = (-1, shape[-1], 1)
        softmax_loop(scores.reshape(view), scores.reshape(view), False, empty_is_zero)
        np.matmul(scores, v, out=outputs[0], casting="unsafe")
    return run


def _scratch(workspace: np.ndarray | None, shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    n = math.prod(shape)
    if workspace is not None and workspace.nbytes >= n * dt.itemsize:
        return workspace.reshape(-1).view(np.uint8)[:n * dt.itemsize].view(dt).reshape(shape)
    return np.empty(shape, dt)  # called without the planned workspace (direct use outside the runtime)


KERNELS = {"Attention": CpuKernel(build, _workspace)}
