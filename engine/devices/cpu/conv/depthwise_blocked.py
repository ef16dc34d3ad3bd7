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
from numba import njit

from engine.devices.cpu.epilogue import apply_activation
from engine.devices.cpu.kernel import packed, remember
from engine.devices.cpu.layout.blocked_ops import to_blocked
from engine.devices.cpu.layout.loops import zero_lanes
from engine.devices.cpu.loops import fused_epilogue as E
from engine.devices.cpu.loops.fused_epilogue import activate_row
from engine.devices.cpu.threads import parallel_for
from engine.errors import KernelError
from engine.ops.conv_geometry import ConvGeom

_DUMMY5 = np.zeros((1, 1, 1, 1, 1), np.float32)
BAND = 8  # output rows per work item: a block's tiles are made once per band
CHUNK = 32  # pixels per multiply-add pass: the tiles of 9 taps (18 KiB at 16 lanes) stay in L1 beside the rows


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
def depthwise_blocked(x, w, bias, z, has_z, out, dh, dw, pt, pl, act, p0, p1, p2, lo, hi):
    """Work items [lo, hi) (over (n, block, band of BAND output rows)) of a stride-1 depthwise conv on blocked
    values.

    x (N, Cb, H, W, B), w (Cb, kh, kw, B), bias (Cb, B), z like out or a dummy, out (N, Cb, OH, OW, B); zero
    padding; the bias, residual and a numba-known activation (`act`, E.ACT_CODES) fused. A tap's weights vary by
    lane, so each is tiled CHUNK pixels wide once per item: a tap over a run of pixels is then one flat
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

    def run(self, x: np.ndarray, z: np.ndarray | None, out: np.ndarray) -> None:
        geo = self._geo(x.shape)
        blocks = -(-self.c // self.block)
        want = (geo.n, blocks, geo.oh, geo.ow, self.block)
        # the loop indexes without bounds checks: arrays of any other shape are refused, not read past their end
        if x.shape != (geo.n, blocks, geo.h, geo.w, self.block) or out.shape != want or (
                z is not None and z.shape != want):
            raise KernelError(f"depthwise conv on blocked values: input {x.shape}, output {out.shape}, residual "
                              f"{None if z is None else z.shape}; want output {want}")
        n, cb, oh, ow, b = out.shape
        parallel_for(depthwise_blocked, n * cb * -(-oh // BAND), out.size * geo.kh * geo.kw, x, self.w, self.bias,
                     _DUMMY5 if z is None else z, z is not None, out, *geo.dilation, *geo.pads[:2], self.code,
                     *self.p)
        if self.late is not None:
            apply_activation(*self.late, out)
        if self.c % b:
            zero_lanes(out.reshape(n, cb, oh * ow, b), self.c % b, 0, n)
