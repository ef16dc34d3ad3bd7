"""A stride-1 depthwise ConvBlocked on nChw{B}c itself, for the geometries oneDNN has no jit kernel for: the atrous
convolutions of ASPP heads and DeepLab backbones (on an AVX2 host from dilation 6; on an AVX-512 one 3x3 at dilation
12 and 7x7 at 3, where its jit kernel still takes 3x3 at 6).

Before this, such a conv ran the direct NCHW kernel between NCHW copies of its blocked sides (`_PlainDirect` in
blocked.py): at 256 channels @65, dilation 12, the layer took 1.92 ms on 2 threads (2.19 on one), half of it the
copies; here 0.70-0.92 ms (1.10 on one) and no workspace. The B lanes of a pixel are B channels side by side, each
with its own weight, so a tap's weights are tiled along a run of pixels and the tap becomes one flat multiply-add
of the run's contiguous lanes, which LLVM vectorises; a band of one block's output rows (OW x B floats each) stays
in cache while every tap adds into it.

Padding lanes (channels past C in the last block) come out zero, as the layout asks: their weights and bias are
zero, and the lanes are cleared after the epilogue anyway (an activation need not keep 0 at 0, and an input whose
padding lanes held an inf would give 0 * inf = NaN there, which a following conv would spread: 0 * NaN).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from engine.devices.cpu import threads as T
from engine.devices.cpu.epilogue import apply_activation
from engine.devices.cpu.fused_calls import Native, team_record
from engine.devices.cpu.kernel import packed, remember
from engine.devices.cpu.layout.blocked_ops import to_blocked
from engine.devices.cpu.layout.loops import zero_lanes
from engine.devices.cpu.loops import fused_epilogue as E
from engine.devices.cpu.loops.fused_epilogue import activate_row
from engine.devices.cpu.loops.native import f32_at, open_job, region, team_share
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.threads import native_regions, parallel_for, region_job, run_native
from engine.errors import KernelError
from engine.ops.conv_geometry import ConvGeom

_DUMMY5 = np.zeros((1, 1, 1, 1, 1), np.float32)
BAND = 8  # output rows per work item: a block's tiles are made once per band
CHUNK = 32  # pixels per multiply-add pass: the tiles of 9 taps (18 KiB at 16 lanes) stay in L1 beside the rows
# Where OpenMP's threads spin through a request (threads.native_regions) the loop splits as one native region
# (depthwise_blocked_team: no thread entering Python) from this many taps, over Python callbacks from MIN_WORK.
NATIVE_BLOCKED_TAPS = 1 << 16


@njit(nogil=True, cache=True, inline="always")
def _ow_range(off: int, w_n: int, ow_n: int) -> tuple[int, int]:
    """The output columns ow whose input column ow + off lies in [0, w_n) (stride 1)."""
    return max(0, -off), max(max(0, -off), min(ow_n, w_n - off))


@njit(nogil=True, cache=True, inline="always")
def _axpy(acc, s, wt):
    """acc += s * wt elementwise: one long loop, which LLVM vectorises (with a runtime overlap check)."""
    for k in range(acc.shape[0]):
        acc[k] += s[k] * wt[k]


@njit(nogil=True, cache=True)
def depthwise_blocked(x, w, bias, z, has_z, out, dh, dw, pt, pl, act, p0, p1, p2, lanes, lo, hi):
    """Work items [lo, hi) (over (n, block, band of BAND output rows)) of a stride-1 depthwise conv on blocked
    values.

    x (N, Cb, H, W, B), w (Cb, kh, kw, B), bias (Cb, B), z like out or a dummy, out (N, Cb, OH, OW, B); zero
    padding; the bias, residual and a numba-known activation (`act`, E.ACT_CODES) fused; the last block's lanes
    from `lanes` on (its padding lanes, none when `lanes` is B) written 0 after the activation. A tap's weights
    vary by lane, so each is tiled CHUNK pixels wide once per item: a tap over a run of pixels is then one flat
    multiply-add of the run's contiguous lanes (a fixed 16-lane loop per pixel does not vectorise: LLVM cannot
    rule out that the output row overlaps the input).
    """
    cb_n, h_n, w_n, b = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
    oh_n, ow_n = out.shape[2], out.shape[3]
    kh, kw = w.shape[1], w.shape[2]
    bands = (oh_n + BAND - 1) // BAND
    tiles = np.empty((kh * kw, CHUNK * b), np.float32)
    for item in range(lo, hi):
        band = item % bands
        n, cb = item // (bands * cb_n), (item // bands) % cb_n
        for t in range(kh * kw):
            wt, tile = w[cb, t // kw, t % kw], tiles[t]
            for p in range(CHUNK):
                for lane in range(b):
                    tile[p * b + lane] = wt[lane]
        xs, bv = x[n, cb].reshape(h_n * w_n * b), bias[cb]
        for oh in range(band * BAND, min(oh_n, (band + 1) * BAND)):
            row = out[n, cb, oh].reshape(ow_n * b)
            for p in range(ow_n):
                for lane in range(b):
                    row[p * b + lane] = bv[lane]
            for i in range(kh):
                ih = oh - pt + i * dh
                if ih < 0 or ih >= h_n:
                    continue
                for j in range(kw):
                    off = j * dw - pl
                    c0, c_hi = _ow_range(off, w_n, ow_n)
                    tile = tiles[i * kw + j]
                    while c0 < c_hi:
                        c1 = min(c_hi, c0 + CHUNK)
                        at = (ih * w_n + c0 + off) * b
                        _axpy(row[c0 * b:c1 * b], xs[at:at + (c1 - c0) * b], tile)
                        c0 = c1
            if has_z:
                zrow = z[n, cb, oh].reshape(ow_n * b)
                for k in range(ow_n * b):
                    row[k] += zrow[k]
            activate_row(row, act, p0, p1, p2)
            if cb == cb_n - 1:
                for p in range(ow_n):
                    for lane in range(lanes, b):
                        row[p * b + lane] = 0.0


# `job` (int64 words) of `depthwise_blocked_team`: OpenMP's two getters (open_job); the items; x's N, Cb, H, W, B
# and out's OH, OW; kh, kw; the float32 x, weights, bias, z and out addresses (z: a 1-element 5-D array where there
# is none); whether there is a z; dh, dw, pt, pl; the activation code, its three float32 parameters' bits; lanes.
(DB_ITEMS, DB_N, DB_CB, DB_H, DB_W, DB_B, DB_OH, DB_OW, DB_KH, DB_KW, DB_X, DB_WT, DB_BIAS, DB_Z, DB_OUT, DB_HAS_Z,
 DB_DH, DB_DW, DB_PT, DB_PL, DB_ACT, DB_P0, DB_P1, DB_P2, DB_LANES, DB_LEN) = range(2, 28)


@njit(nogil=True, cache=True, inline="always")
def _f32_bits(word):
    return np.int32(word).view(np.float32)


@region
def depthwise_blocked_team(data):
    """One OpenMP thread's share of the items of a `depthwise_blocked` call (see DB_*), as parallel_for splits them;
    called outside a region, all of them (a native program's call)."""
    job, t, team = open_job(data, DB_LEN)
    items = job[DB_ITEMS]
    lo, hi = team_share(items, t, team)
    if lo >= hi:
        return
    n, cb, b, oh, ow = job[DB_N], job[DB_CB], job[DB_B], job[DB_OH], job[DB_OW]
    x = carray(f32_at(job[DB_X]), (n, cb, job[DB_H], job[DB_W], b))
    out = carray(f32_at(job[DB_OUT]), (n, cb, oh, ow, b))
    has_z = job[DB_HAS_Z] != 0
    z = carray(f32_at(job[DB_Z]), (n, cb, oh, ow, b) if has_z else (1, 1, 1, 1, 1))
    w = carray(f32_at(job[DB_WT]), (cb, job[DB_KH], job[DB_KW], b))
    bias = carray(f32_at(job[DB_BIAS]), (cb, b))
    depthwise_blocked(x, w, bias, z, has_z, out, job[DB_DH], job[DB_DW], job[DB_PT], job[DB_PL], job[DB_ACT],
                      _f32_bits(job[DB_P0]), _f32_bits(job[DB_P1]), _f32_bits(job[DB_P2]), job[DB_LANES], lo, hi)


class BlockedDepthwise:
    """The kernel of one depthwise ConvBlocked with both sides blocked: weights and bias packed by lanes once,
    `run` over any input shape within the max."""

    impl = "direct:depthwise-blocked"

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None, activation: str | None, act_params: dict | None,
                 block: int, geometry):
        c, _, kh, kw = weight.shape
        self.c, self.block, self.geometry = c, block, geometry
        # per-channel values laid out as the blocked data: (Cb, kh, kw, B) and (Cb, B), padding lanes zero
        self.w = packed(to_blocked(np.asarray(weight, np.float32).reshape(1, c, kh, kw), block)[0])
        b = np.zeros(c, np.float32) if bias is None else np.asarray(bias, np.float32).ravel()
        self.bias = packed(to_blocked(b.reshape(1, c, 1, 1), block)[0, :, 0, 0])
        code = E.act_code(activation, act_params)
        # every activation ConvBlocked accepts has a numba code today; one added later without it runs after the loop
        self.late = None if code is not None or activation is None else (activation, act_params)
        self.code, *params = code or (E.ACT_NONE, 0.0, 0.0, 0.0)
        self.p = tuple(np.float32(v) for v in params)
        self._geos: dict[tuple, ConvGeom] = {}

    def _geo(self, shape: tuple) -> ConvGeom:
        geo = self._geos.get(shape)
        return geo if geo is not None else remember(self._geos, shape, self.geometry(shape))

    @staticmethod
    def applies(geo: ConvGeom) -> bool:
        """Stride 1 only: a strided conv's taps do not read contiguous runs of pixels."""
        return geo.stride == (1, 1)

    def _checked(self, x: np.ndarray, z: np.ndarray | None, out: np.ndarray) -> ConvGeom:
        geo = self._geo(x.shape)
        blocks = -(-self.c // self.block)
        want = (geo.n, blocks, geo.oh, geo.ow, self.block)
        # the loop indexes without bounds checks: arrays of any other shape are refused, not read past their end
        if x.shape != (geo.n, blocks, geo.h, geo.w, self.block) or out.shape != want or (
                z is not None and z.shape != want):
            raise KernelError(f"depthwise conv on blocked values: input {x.shape}, output {out.shape}, residual "
                              f"{None if z is None else z.shape}; want output {want}")
        return geo

    def _lanes(self) -> int:
        """The real lanes of the last block, the loop zeroing the rest (all of them kept with a late activation,
        after which `run` zeroes them)."""
        return self.c % self.block if self.c % self.block and self.late is None else self.block

    def _split(self, out: np.ndarray, geo: ConvGeom) -> tuple[int, int]:
        """(items, the work parallel_for and team_record split by): where regions run natively, from
        NATIVE_BLOCKED_TAPS taps on the team, else from threads.MIN_WORK taps over Python callbacks."""
        n, cb, oh, _, _ = out.shape
        taps = out.size * geo.kh * geo.kw
        if native_regions():
            return n * cb * -(-oh // BAND), T.MIN_WORK if taps >= NATIVE_BLOCKED_TAPS else 0
        return n * cb * -(-oh // BAND), taps

    def job(self, x: np.ndarray, z: np.ndarray | None, out: np.ndarray, geo: ConvGeom) -> np.ndarray:
        """depthwise_blocked_team's job for these arrays (see DB_*)."""
        job = region_job(DB_LEN)
        job[DB_ITEMS] = self._split(out, geo)[0]
        job[DB_N:DB_OH] = x.shape
        job[DB_OH], job[DB_OW], job[DB_KH], job[DB_KW] = geo.oh, geo.ow, geo.kh, geo.kw
        job[DB_X:DB_HAS_Z] = [D.address(a) for a in (x, self.w, self.bias, _DUMMY5 if z is None else z, out)]
        job[DB_HAS_Z], job[DB_DH:DB_PT], job[DB_PT:DB_ACT] = z is not None, geo.dilation, geo.pads[:2]
        job[DB_ACT], job[DB_LANES] = self.code, self._lanes()
        job[DB_P0:DB_LANES] = [np.float32(v).view(np.int32) for v in self.p]
        return job

    def run(self, x: np.ndarray, z: np.ndarray | None, out: np.ndarray) -> None:
        geo = self._checked(x, z, out)
        n, cb, oh, ow, b = out.shape
        items, work = self._split(out, geo)
        # the region reads every array as one dense buffer: a strided one (no arena view is) takes the loop
        native = (T.chunks_for(items, work) > 1 and native_regions()
                  and all(a.flags.c_contiguous for a in (x, out) + (() if z is None else (z,))))
        if not (native and run_native(depthwise_blocked_team().address, self.job(x, z, out, geo))):
            parallel_for(depthwise_blocked, items, work, x, self.w, self.bias, _DUMMY5 if z is None else z,
                         z is not None, out, *geo.dilation, *geo.pads[:2], self.code, *self.p, self._lanes())
        if self.late is not None:
            apply_activation(*self.late, out)
            if self.c % b:
                zero_lanes(out.reshape(n, cb, oh * ow, b), self.c % b, 0, n)

    def records(self, x: np.ndarray, z: np.ndarray | None, out: np.ndarray) -> Native | None:
        """`run` on these (contiguous) arrays as native_program records; None with a late activation (its pass)
        or where `run` splits over Python callbacks."""
        if self.late is not None:
            return None
        geo = self._checked(x, z, out)
        job = self.job(x, z, out, geo)
        record = team_record(depthwise_blocked_team().address, job, *self._split(out, geo))
        return None if record is None else Native([record], [], [job, self.w, self.bias])
