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
over all threads instead of once per thread. The slots claim items in turn from a shared counter, so a thread
that lost its core to another process (a shared host) leaves its share to the others. A slot's m is as wide as
the output (an item's part's columns only written): the output transform addresses channels globally.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from engine.devices.cpu.conv import winograd_simd as S
from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import matmul as dnn
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.threads import parallel_for

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

    def _schedule(self, total: int, buf: np.ndarray, threads: int) -> tuple[list, list] | None:
        """The items, (t0, t1, kb0, kb1, index of its GEMM), and per slot, per GEMM: (its runner's run, v, m,
        (v, U, m column) addresses); None when `buf` is too small for the slots."""
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
        with self._unpacked():
            for slot in range(threads):
                mine = []
                for t, k0, k1 in gemms:
                    plan, u = self._plan(t, k0, k1)
                    v = _view(buf, slot * size, (self.products, t, self.c))
                    m = _view(buf, slot * size + v_bytes, (self.products, t, self.o))
                    mine.append((plan.runner().run, v, m, (D.address(v), u, D.address(m) + 4 * k0)))
                slots.append(mine)
        got = self._schedules[key] = (items, slots)
        return got

    def run(self, geo, tiles_hw: tuple[int, int], x: np.ndarray, z: np.ndarray | None, out: np.ndarray,
            buf: np.ndarray, threads: int, epi) -> bool:
        """out = conv(x) + bias (+ z), the inline activation applied; False (nothing run) when `buf` holds less
        than workspace_bytes(...) (the thread count grew since the workspace was sized)."""
        th, tw = tiles_hw
        schedule = self._schedule(geo.n * th * tw, buf, threads)
        if schedule is None:
            return False
        zz = out if z is None else z
        parallel_for(_run_slots, threads, 1 << 30, *schedule, itertools.count(), x, out, zz, z is not None,
                     epi.bias, epi.code, epi.lo, epi.hi, self.m, th, tw, geo.pads[0], geo.pads[1],
                     self.c // self.block)
        return True


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


def _view(buf: np.ndarray, offset: int, shape: tuple[int, ...]) -> np.ndarray:
    """float32 `shape` over buf[offset:]."""
    return buf[offset:offset + 4 * math.prod(shape)].view(np.float32).reshape(shape)
