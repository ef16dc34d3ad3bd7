"""Winograd (winograd_blocked) as ONE parallel region per conv, for more than one thread.

The chunked path runs three stages per chunk: the transforms on the engine's pool, the batched matmul on OpenMP's
team, so every chunk hands over between the two sets of threads (several wake-ups per conv, which eat the second
thread's gain on a 2-core VM). Here each thread runs whole work items end to end, with no hand-over inside the
conv: the input transform of its tiles into its own v, its GEMMs on a one-thread oneDNN matmul primitive
(onednn/matmul.py's ThreadPlan: one Runner per thread slot, run inline on the pool thread), the output transform
with the epilogue from its own m.

Items split the conv by tiles where there are many (ResNet-18's 56x56 and 28x28 maps), each item at most
ITEM_BYTES of v and m so they stay in L2; where tiles are few (fewer than SPLIT_TILES per thread: 512ch@7 has 4
F(4x4) or 16 F(2x2) tiles) every thread takes all tiles and a part of the output-channel blocks: each transforms
the (small) input itself and multiplies it by its own columns of U, so U, the big operand there, is read once
over all threads instead of once per thread. A slot's m is as wide as the output (an item's part's columns only
written): the output transform addresses channels globally.

Where our kernels' splits run natively on OpenMP's team (threads.native_regions: Intel's OpenMP under `run`), the
region is one native function (`winograd_team`, a numba cfunc): each thread takes the items in turn by its thread
number and calls oneDNN's execution of its slot's matmul itself (the runners bound to the slot's buffers once, each
slot on a stream of its own), so no Python runs inside the conv and it can be recorded into a native program
(fused_calls.py). From Python, the slots' loop split over our pool's callbacks took the GIL item by item and the
second thread started 25-45 us late: on a 2-vCPU AVX-512 Xeon, batch 1, 64ch@56 0.61 -> 0.40 ms (one thread:
0.76), 128ch@28 0.54 -> 0.39 (0.64); ResNet-18 13.0 -> 10.6 ms, 75 -> 66 at batch 8. Elsewhere the slots claim
items in turn from a shared counter, so a thread that lost its core to another process (a shared host) leaves its
share to the others; the native region's fixed turns do not (a preempted thread's items wait for it).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from numba import carray, njit

from engine.devices.cpu import native_program as N
from engine.devices.cpu.conv import winograd_simd as S
from engine.devices.cpu.fused_calls import Native
from engine.devices.cpu.loops.native import (
    call_int_p,
    call_int_ppip,
    f32_at,
    f64_at,
    i64_at,
    i64_view,
    open_job,
    region,
    status_check,
)
from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import matmul as dnn
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.threads import native_regions, parallel_for, region_job, region_record, run_native
from engine.errors import KernelError

ITEM_BYTES = 1 << 20  # v and m of one item: in L2 (1-2 MiB a core on the AVX-512 Xeons measured)
SPLIT_TILES = 16  # tiles per thread below which the threads split output channels instead of tiles
MAX_SCHEDULES = 8  # (shape, workspace, threads) combinations kept; a new one past this starts over
MAX_PLANS = 64  # matmul plans kept (one per chunk length and part: dynamic maps make new ones); past this, start over


@dataclass(frozen=True)
class Split:
    """Items of `tiles` tiles (the last chunk may be shorter) by `parts` output-channel parts."""
    total: int  # tiles of the conv
    tiles: int
    parts: int
    kblocks: int

    def items(self) -> list[tuple[int, int, int, int]]:
        """(first tile, end tile, first channel block, end block) per item, chunk-major."""
        return [(t0, min(self.total, t0 + self.tiles), self.kblocks * p // self.parts,
                 self.kblocks * (p + 1) // self.parts)
                for t0 in range(0, self.total, self.tiles) for p in range(self.parts)]


def split(total: int, c: int, k: int, block: int, products: int, threads: int) -> Split:
    """The work items of a conv of `total` tiles, c -> k channels, over `threads` slots."""
    kblocks = k // block
    parts = threads if total < SPLIT_TILES * threads and kblocks >= threads else 1
    # each item reads its part of U whole: items no smaller than that part (fewer reads of a big U), nor than
    # ITEM_BYTES
    budget = max(ITEM_BYTES, products * c * k * 4 // parts)
    chunks = max(1, math.ceil(total * products * (c + k) * 4 / budget))
    if parts == 1:
        chunks = -(-max(chunks, threads) // threads) * threads  # every slot the same number of items
    chunks = min(chunks, total)
    return Split(total, -(-total // chunks), parts, kblocks)


def max_item_tiles(total: int, c: int, k: int, products: int) -> int:
    """The most tiles one item of `split` holds, over every tile count up to `total`.

    An item's chunk is ceil(t / chunks) tiles with chunks >= t * per_tile / budget (or one chunk, when t * per_tile
    fits in the budget), so it never exceeds ceil(budget / per_tile), whatever the parts and the rounding of chunks
    up to the threads (which only shortens chunks); the budget is largest with one part."""
    per_tile = products * (c + k) * 4
    return max(1, min(total, -(-max(ITEM_BYTES, products * c * k * 4) // per_tile)))


class Region:
    """The one-region path of one WinogradConv: per-thread matmul plans (one per chunk length and channel part),
    U packed for each, and per (shape, workspace, threads) the slots' items with their runners and views."""

    def __init__(self, c: int, o: int, m: int, block: int, weights: Callable[[], np.ndarray]):
        self.c, self.o, self.m, self.block = c, o, m, block
        self.products = (m + 2) ** 2
        self._u = weights  # U (products, C, K) float32, made when a part is first packed
        self._plain: np.ndarray | None = None  # U while one prepare or schedule packs parts (`_unpacked`)
        self._plans: dict[tuple[int, int, int], tuple[dnn.ThreadPlan, int]] = {}  # (tiles, k0, k1) -> plan, U
        self._packed: list[tuple[tuple, np.ndarray]] = []  # ((k0, k1, weights descriptor), packed U columns)
        self._schedules: dict[tuple, list] = {}

    def split(self, total: int, threads: int) -> Split:
        return split(total, self.c, self.o, self.block, self.products, threads)

    def slot_bytes(self, s: Split) -> int:
        return self._slot_bytes(s.tiles)

    def _slot_bytes(self, tiles: int) -> int:
        return D.aligned(self.products * tiles * self.c * 4) + D.aligned(self.products * tiles * self.o * 4)

    def workspace_bytes(self, total: int, threads: int) -> int:
        """The slots of every shape up to `total` tiles (a smaller batch or map may split by channels, each slot then
        holding all its tiles, where the max shape split by tiles): sized from `max_item_tiles`."""
        return threads * self._slot_bytes(max_item_tiles(total, self.c, self.o, self.products))

    def prepare(self, total: int, threads: int) -> None:
        """The plans and packed filters of this shape's items, so its first run builds nothing."""
        with self._unpacked():
            for t0, t1, kb0, kb1 in self.split(total, threads).items():
                self._plan(t1 - t0, kb0 * self.block, kb1 * self.block)

    @contextlib.contextmanager
    def _unpacked(self) -> Iterator[None]:
        """U made at most once for all the parts packed inside (0.36 s for 512 -> 512 channels), let go after."""
        try:
            yield
        finally:
            self._plain = None

    def _plan(self, t: int, k0: int, k1: int) -> tuple[dnn.ThreadPlan, int]:
        key = (t, k0, k1)
        if key not in self._plans:
            if len(self._plans) >= MAX_PLANS:  # the schedules keep the runners of the plans they use
                self._plans.clear()
            p, kw = self.products, k1 - k0
            src = D.MemoryDesc.plain((p, t, self.c))
            dst = D.MemoryDesc.strided((p, t, kw), (t * self.o, self.o, 1))  # its columns of the slot's m
            plan = dnn.packed_thread_plan(src, D.MemoryDesc.any((p, self.c, kw)), dst)
            self._plans[key] = (plan, D.address(self._packed_u(k0, k1, plan.mds[L.ARG_WEIGHTS])))
        return self._plans[key]

    def _packed_u(self, k0: int, k1: int, md: D.MemoryDesc) -> np.ndarray:
        for (a, b, have), buf in self._packed:
            if (a, b) == (k0, k1) and have == md:
                return buf
        if self._plain is None:
            self._plain = self._u()
        cols = np.ascontiguousarray(self._plain[:, :, k0:k1])
        buf = D.reorder_into(cols, D.MemoryDesc.plain(cols.shape), md)
        self._packed.append(((k0, k1, md), buf))
        return buf

    def _schedule(self, total: int, buf: np.ndarray, threads: int) -> tuple[list, list, tuple] | None:
        """The items, (t0, t1, kb0, kb1, index of its GEMM); per slot, per GEMM: (its runner's run, v, m, (v, U,
        m column) addresses); and the native region's view of them: (items as int64 rows, the slots' table (see
        TABLE_WORDS), what the table points at, the jobs made for it (`_job`)). None when `buf` is too small for
        the slots."""
        key = (total, D.address(buf), buf.nbytes, threads)
        if key in self._schedules:
            return self._schedules[key]
        if len(self._schedules) >= MAX_SCHEDULES:
            self._schedules.clear()
        s = self.split(total, threads)
        size, v_bytes = self.slot_bytes(s), D.aligned(self.products * s.tiles * self.c * 4)
        if threads * size > buf.nbytes:
            self._schedules[key] = None
            return None
        gemms: dict[tuple[int, int, int], int] = {}  # plan key -> index
        items = []
        for t0, t1, kb0, kb1 in s.items():
            plan_key = (t1 - t0, kb0 * self.block, kb1 * self.block)
            items.append((t0, t1, kb0, kb1, gemms.setdefault(plan_key, len(gemms))))
        slots = []
        # the native region's view of the same: per slot and GEMM (v, m, tiles, primitive, stream, argument count,
        # arguments), each slot's runners bound to its buffers for good and executing on the slot's own stream
        table = np.zeros((threads, len(gemms), TABLE_WORDS), np.int64)
        keep: list = []
        with self._unpacked():
            for slot in range(threads):
                mine, stream = [], D.Stream()
                keep.append(stream)
                for g, (t, k0, k1) in enumerate(gemms):
                    plan, u = self._plan(t, k0, k1)
                    v = _view(buf, slot * size, (self.products, t, self.c))
                    m = _view(buf, slot * size + v_bytes, (self.products, t, self.o))
                    runner, ptrs = plan.runner(), (D.address(v), u, D.address(m) + 4 * k0)
                    prim, nargs, args = runner.bind(*ptrs)
                    table[slot, g] = D.address(v), D.address(m), t, prim, stream.h.value, nargs, args
                    keep.append(runner)
                    mine.append((runner.run, v, m, ptrs))
                slots.append(mine)
        native = (np.array(items, np.int64).reshape(-1, ITEM_WORDS), table, keep, {})  # {}: its jobs (_job)
        got = self._schedules[key] = (items, slots, native)
        return got

    def run(self, geo, tiles_hw: tuple[int, int], x: np.ndarray, z: np.ndarray | None, out: np.ndarray,
            buf: np.ndarray, threads: int, epi) -> bool:
        """out = conv(x) + bias (+ z), the inline activation applied; False (nothing run) when `buf` holds less
        than workspace_bytes(...) (the thread count grew since the workspace was sized). As one native region
        (`winograd_team`) where our kernels' splits run natively, else the slots from Python."""
        th, tw = tiles_hw
        schedule = self._schedule(geo.n * th * tw, buf, threads)
        if schedule is None:
            return False
        if threads > 1 and native_regions():
            entry = self._job(schedule, geo, tiles_hw, x, z, out, epi)  # held (with its clip bounds) while it runs
            job = entry[0]
            job[WJ_STATUS:] = 0
            if run_native(winograd_team().address, job):
                failed = [int(v) for v in job[WJ_STATUS:] if v]
                job[WJ_STATUS:] = 0  # the recorded program's wait reads the same words
                if failed:
                    call = "dnnl_stream_wait" if failed[0] >> 32 == FAILED_WAIT else "dnnl_primitive_execute"
                    raise KernelError(f"Winograd conv: oneDNN {call} failed with status {failed[0] & 0xFFFFFFFF} "
                                      f"(its tiles NaN)")
                return True
        items, slots = schedule[:2]
        zz = out if z is None else z
        parallel_for(_run_slots, threads, 1 << 30, items, slots, itertools.count(), x, out, zz, z is not None,
                     epi.bias, epi.code, epi.lo, epi.hi, self.m, th, tw, geo.pads[0], geo.pads[1],
                     self.c // self.block)
        return True

    def records(self, geo, tiles_hw: tuple[int, int], x: np.ndarray, z: np.ndarray | None, out: np.ndarray,
                buf: np.ndarray, threads: int, epi) -> Native | None:
        """`run` on these (C-contiguous) arrays as a native_program record: the region on OpenMP's team, or its
        function on this thread for one thread; None where `run` would split from Python or not run."""
        th, tw = tiles_hw
        schedule = self._schedule(geo.n * th * tw, buf, threads)
        if schedule is None:
            return None
        entry = self._job(schedule, geo, tiles_hw, x, z, out, epi)
        job, fn = entry[0], winograd_team().address
        if threads == 1:
            record: tuple | None = (N.OP_CALL, fn, job.ctypes.data)
        else:
            record = region_record(fn, job.ctypes.data) if native_regions() else None
        if record is None:
            return None
        # the slots' statuses as a wait: a failed execution fails the program (the node named, the program dropped)
        status = (N.OP_WAIT, winograd_failed().address, job.ctypes.data)
        return Native([record, status], [], [self, schedule, entry, epi])

    def _job(self, schedule: tuple, geo, tiles_hw: tuple[int, int], x: np.ndarray, z: np.ndarray | None,
             out: np.ndarray, epi) -> tuple[np.ndarray, np.ndarray]:
        """(winograd_team's job, the float64 clip bounds it points at) for these arrays (see WJ_*), kept with the
        schedule per addresses and shapes (a binding's arrays are the same run after run; a job points into its
        schedule's arrays, so it lives and dies with it)."""
        items, table, _, jobs = schedule[2]
        key = (D.address(x), x.shape, D.address(out), out.shape, None if z is None else D.address(z))
        got = jobs.get(key)
        if got is not None:
            return got
        if len(jobs) >= MAX_SCHEDULES:
            jobs.clear()
        threads, gemms = table.shape[:2]
        job = region_job(WJ_STATUS + threads)
        job[WJ_ITEMS:WJ_X] = items.ctypes.data, items.shape[0], table.ctypes.data, threads, gemms
        job[WJ_X], job[WJ_XSHAPE:WJ_OUT] = D.address(x), x.shape
        job[WJ_OUT], job[WJ_OSHAPE:WJ_Z] = D.address(out), out.shape[1:4]
        job[WJ_Z], job[WJ_BIAS], job[WJ_CODE] = 0 if z is None else D.address(z), D.address(epi.bias), epi.code
        clip = np.array([epi.lo, epi.hi], np.float64)
        job[WJ_CLIP], job[WJ_M], job[WJ_TH], job[WJ_TW] = clip.ctypes.data, self.m, *tiles_hw
        job[WJ_PT], job[WJ_PL], job[WJ_CBS] = geo.pads[0], geo.pads[1], self.c // self.block
        job[WJ_P], job[WJ_C], job[WJ_O] = self.products, self.c, self.o
        job[WJ_EXEC], job[WJ_WAIT] = D.fn_address("dnnl_primitive_execute"), D.fn_address("dnnl_stream_wait")
        got = jobs[key] = (job, clip)
        return got


def _run_slots(items, slots, claim, x, out, zz, has_z, bias, code, lo_clip, hi_clip, m, th, tw, pt, pl, cbs, lo,
               hi):
    """Slots [lo, hi), each running the items it claims (`claim`, shared by the slots: a thread that lost its core
    to another process leaves the rest of the items to the others), each item end to end."""
    n = len(items)
    for s in range(lo, hi):
        gemms = slots[s]
        for i in claim:  # itertools.count's next is atomic under the GIL
            if i >= n:
                break
            t0, t1, kb0, kb1, g = items[i]
            gemm, v, prod, ptrs = gemms[g]
            S.input_transform(x, v, m, t0, t1, th, tw, pt, pl, 1, 0, cbs)
            gemm(*ptrs)
            S.output_transform(prod, out, zz, has_z, bias, code, lo_clip, hi_clip, m, t0, t1, th, tw, 1, kb0, kb1)


ITEM_WORDS = 5  # an item: first tile, end tile, first channel block, end block, index of its GEMM
TABLE_WORDS = 7  # per slot and GEMM: v, m, tiles, primitive, stream, argument count, arguments
# `job` (int64 words) of `winograd_team`: OpenMP's two getters; the items (address, count); the slots' table
# (address, slots, GEMMs); x's address and (N, CB, H, W, B); out's address and (KB, OH, OW); z's address (0: none);
# the bias's; the activation's code and the address of its float64 (lo, hi); the tile m, tiles down and across, the
# top and left pads, C's blocks; products, C, K; the addresses of dnnl_primitive_execute and dnnl_stream_wait; then
# one status word per slot (a failed call's: FAILED_*).
(WJ_ITEMS, WJ_N_ITEMS, WJ_TABLE, WJ_SLOTS, WJ_GEMMS, WJ_X, WJ_XSHAPE) = range(2, 9)
WJ_OUT = WJ_XSHAPE + 5
WJ_OSHAPE = WJ_OUT + 1
(WJ_Z, WJ_BIAS, WJ_CODE, WJ_CLIP, WJ_M, WJ_TH, WJ_TW, WJ_PT, WJ_PL, WJ_CBS, WJ_P, WJ_C, WJ_O, WJ_EXEC, WJ_WAIT,
 WJ_STATUS) = range(WJ_OSHAPE + 3, WJ_OSHAPE + 19)
FAILED_EXECUTE, FAILED_WAIT = 1, 2  # a status word: which call failed (<< 32) | oneDNN's status


@region
def winograd_team(data):
    """One OpenMP thread's items of a Winograd conv (see WJ_*), end to end on its own slot: the input transform into
    its v, its GEMM (a one-thread oneDNN matmul, bound to its buffers, on its slot's stream), the output transform.
    Items go round the threads in turn (a thread past the slots takes none). A failed call leaves its status in the
    job and its item's outputs NaN (never a stale number); the Python caller raises on it, a recorded program fails
    at the `winograd_failed` wait after the region."""
    job, t, team = open_job(data, WJ_STATUS)
    slots = job[WJ_SLOTS]
    job = carray(i64_view(data), (WJ_STATUS + slots,))  # with the status words
    team = min(team, slots)
    if t >= team:
        return
    n_items, gemms = job[WJ_N_ITEMS], job[WJ_GEMMS]
    items = carray(i64_at(job[WJ_ITEMS]), (n_items, ITEM_WORDS))
    table = carray(i64_at(job[WJ_TABLE]), (slots, gemms, TABLE_WORDS))
    xs, os_ = job[WJ_XSHAPE:WJ_XSHAPE + 5], job[WJ_OSHAPE:WJ_OSHAPE + 3]
    x = carray(f32_at(job[WJ_X]), (xs[0], xs[1], xs[2], xs[3], xs[4]))
    out = carray(f32_at(job[WJ_OUT]), (xs[0], os_[0], os_[1], os_[2], xs[4]))
    has_z = job[WJ_Z] != 0
    zz = carray(f32_at(job[WJ_Z] if has_z else job[WJ_OUT]), (xs[0], os_[0], os_[1], os_[2], xs[4]))
    p, c, o, m = job[WJ_P], job[WJ_C], job[WJ_O], job[WJ_M]
    bias, clip = carray(f32_at(job[WJ_BIAS]), (o,)), carray(f64_at(job[WJ_CLIP]), (2,))
    th, tw, pt, pl, cbs, code = job[WJ_TH], job[WJ_TW], job[WJ_PT], job[WJ_PL], job[WJ_CBS], job[WJ_CODE]
    for i in range(t, n_items, team):
        t0, t1, kb0, kb1, g = items[i, 0], items[i, 1], items[i, 2], items[i, 3], items[i, 4]
        row = table[t, g]
        v = carray(f32_at(row[0]), (p, row[2], c))
        prod = carray(f32_at(row[1]), (p, row[2], o))
        S.input_transform(x, v, m, t0, t1, th, tw, pt, pl, 1, 0, cbs)
        status = call_int_ppip(job[WJ_EXEC], row[3], row[4], row[5], row[6])
        which = FAILED_EXECUTE
        if status == 0:
            status, which = call_int_p(job[WJ_WAIT], row[4]), FAILED_WAIT
        if status != 0:
            job[WJ_STATUS + t] = (which << 32) | (status & 0xFFFFFFFF)
            _poison(out, m, t0, t1, th, tw, kb0, kb1)
            continue
        S.output_transform(prod, out, zz, has_z, bias, code, clip[0], clip[1], m, t0, t1, th, tw, 1, kb0, kb1)


@status_check
def winograd_failed(data):
    """The status of a failed oneDNN call in the slots' words of a winograd_team job (0: none), the words cleared:
    a native program's OP_WAIT record after the region."""
    job, _, _ = open_job(data, WJ_STATUS)
    slots = job[WJ_SLOTS]
    job = carray(i64_view(data), (WJ_STATUS + slots,))
    rc = 0
    for s in range(slots):
        v = job[WJ_STATUS + s]
        if v != 0 and rc == 0:
            rc = max(1, v & 0xFFFFFFFF)
        job[WJ_STATUS + s] = 0
    return np.int32(rc)


@njit(nogil=True, cache=True)
def _poison(out, m, t0, t1, th, tw, kb0, kb1):
    """NaN over the output tiles [t0, t1) of channel blocks [kb0, kb1) (a failed GEMM's: no stale number served)."""
    oh, ow = out.shape[2], out.shape[3]
    for t in range(t0, t1):
        n, r = t // (th * tw), t % (th * tw)
        y0, x0 = (r // tw) * m, (r % tw) * m
        out[n, kb0:kb1, y0:min(oh, y0 + m), x0:min(ow, x0 + m), :] = np.nan


def _view(buf: np.ndarray, offset: int, shape: tuple[int, ...]) -> np.ndarray:
    """float32 `shape` over buf[offset:]."""
    return buf[offset:offset + 4 * math.prod(shape)].view(np.float32).reshape(shape)
