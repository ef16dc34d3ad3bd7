"""Depthwise convolutions of ConvBlocked (both sides nChw{B}c, B = 8 or 16) on depthwise_simd's vector kernel.

bench/RESULTS.md's "Layers" had 5x5 and 7x7 depthwise convs of 96 channels at 56x56 at 0.5-0.8 ms of CPU (oneDNN's
jit_dw, the layout reorders of a one-layer graph included) where ONNX Runtime took 0.15-0.27 ms. This kernel keeps
RUN output pixels of a row in registers through every tap (single thread, AVX-512, the conv alone, ms: 5x5 0.16-0.17
against jit_dw's 0.29, 7x7 0.28-0.32 against 0.30-0.50). `computes` says which convs it
computes, `eligible` which of those blocked.py gives it (where it was measured faster); oneDNN keeps the rest.
Work items are (image, channel block, band of output rows) over the kernel pool (threads.parallel_for); a small
conv runs on the calling thread, as a small oneDNN primitive does (threads.threads_for).
"""

from __future__ import annotations

import numpy as np

from engine.devices.cpu import threads
from engine.devices.cpu.conv import depthwise_simd as S
from engine.devices.cpu.conv.winograd_blocked import _INLINE_ACTS, _Epilogue
from engine.devices.cpu.conv.winograd_simd import _epilogue_params
from engine.devices.cpu.epilogue import apply_activation
from engine.ops.conv_geometry import ConvGeom

# work items per thread: bands of rows enough that the split over the pool stays even
ITEMS_PER_THREAD = 4
# The narrowest output rows it is taken for, by kernel width: below these oneDNN's jit_dw was faster (per-row
# and edge costs; single thread, CPU ms, AVX-512: 3x3 384ch@14 0.044 vs 0.030, 5x5 960ch@7 0.046 vs 0.035;
# 3x3 192ch@28 even).
MIN_WIDTH = {3: 28, 5: 14, 7: 14}
# The blocks it was measured faster on: AVX-512's 16 lanes. At 8 (AVX2's block) it computes the same sums but was
# not timed against oneDNN's AVX2 jit_dw, so ConvBlocked keeps that there.
MEASURED_BLOCKS = (16,)


def computes(geo: ConvGeom, block: int, src_blocked: bool, dst_blocked: bool) -> bool:
    """Whether the kernel computes this conv: depthwise (one channel per group, no multiplier), both sides
    blocked by 8 or 16, undilated, a kernel width the unrolled runs exist for, stride 1 or 2 across (any down)."""
    return (src_blocked and dst_blocked and block in S.BLOCKS and geo.groups == geo.c == geo.o
            and tuple(geo.dilation) == (1, 1) and geo.kw in S.KERNEL_SIZES and geo.stride[1] in (1, 2))


def fused(act: str | None, params: dict | None) -> bool:
    """Whether the kernel applies this activation in its epilogue (the rest would be one more pass over the
    output, where oneDNN fuses them: GELU applied after cost 2.4 ms on a 0.15 ms conv, 128ch@56)."""
    return act in _INLINE_ACTS or act == "gelu" and (params or {}).get("approximate", "none") == "none"


def eligible(geo: ConvGeom, block: int, src_blocked: bool, dst_blocked: bool, act: str | None = None,
             params: dict | None = None) -> bool:
    """Whether ConvBlocked takes this kernel over oneDNN's jit_dw: where it computes the conv and was measured
    faster (single thread, AVX-512, CPU ms against jit_dw): stride 1 on rows of at least MIN_WIDTH (5x5 96ch@56
    0.17 vs 0.29, 7x7 32ch@112 0.37 vs 0.68, 7x7 192ch@28 0.16 vs 0.23, 3x3 96ch@56 0.11 vs 0.14). At stride 2
    jit_dw won (3x3 96ch@56 0.028 vs 0.041, 5x5 240ch@14 0.011 vs 0.021): a quarter of the outputs for the same
    edges and strips. Only with an activation it fuses (`fused`)."""
    return (computes(geo, block, src_blocked, dst_blocked) and block in MEASURED_BLOCKS and fused(act, params)
            and tuple(geo.stride) == (1, 1) and geo.ow >= MIN_WIDTH[geo.kw])


class DepthwiseConv:
    """The packed filters, the padded bias and the epilogue of one depthwise ConvBlocked."""

    def __init__(self, w: np.ndarray, bias: np.ndarray | None, act: str | None, act_params: dict | None,
                 block: int):
        self.block = block
        self.w = S.pack_weights(w, block)
        channels = self.w.shape[0] * block
        gelu = act == "gelu" and fused(act, act_params)
        self.epi = _Epilogue(None if gelu else act, None if gelu else act_params, None, channels)
        self.flags = S.GELU if gelu else 0
        if bias is not None:
            self.epi.bias[:len(bias)] = bias
        slope, lo, hi = _epilogue_params(self.epi.code, self.epi.lo, self.epi.hi)
        self.slope, self.lo, self.hi = np.float32(slope), np.float32(lo), np.float32(hi)

    def run(self, geo: ConvGeom, x: np.ndarray, z: np.ndarray | None, out: np.ndarray) -> None:
        """out = act(conv(x) + bias + z) on C-contiguous blocked arrays."""
        n, cbs, oh = x.shape[0], x.shape[1], out.shape[2]
        work = geo.n * geo.c * geo.oh * geo.ow * geo.kh * geo.kw
        pool = threads.threads_for(work)
        bands = min(oh, -(-ITEMS_PER_THREAD * pool // (n * cbs))) if pool > 1 else 1
        flags = self.flags | (S.HAS_Z if z is not None else 0)
        args = (x, self.w, self.epi.bias, out if z is None else z, flags, out, geo.kh, geo.kw,
                geo.stride[0], geo.stride[1], geo.pads[0], geo.pads[1], self.slope, self.lo, self.hi, bands)
        threads.parallel_for(S.depthwise, n * cbs * bands, work if pool > 1 else 0, *args)
        if self.epi.late:
            apply_activation(self.epi.act, self.epi.params, out)
