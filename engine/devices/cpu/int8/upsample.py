"""CPU kernels of TnnQUpsample (engine/ops/quant_upsample.py) on NCHW values and of its NHWC twin
Int8UpsampleNhwc (ops.py; the layout TNN's x86 int8 acc itself walks): numba loops over channels-last rows,
bit-exact with the reference: the taps, weights and factors are the reference's own functions, computed once per
input shape; the bilinear sums are exact in float32 (the op refuses other sizes), so their order is free.
An NCHW value is walked through its channels-last view (strided)."""

from __future__ import annotations

import numpy as np
from numba import njit

from engine.devices.cpu.kernel import Backends, CpuKernel, remember
from engine.devices.cpu.loops.quant import f2i8
from engine.devices.cpu.threads import parallel_for
from engine.ir import Node
from engine.ops.quant_upsample import bilinear_taps, check_exact, factors, nearest_index, output_size
from engine.ops.registry import TensorInfo


@njit(nogil=True, cache=True)
def nearest(x, out, rows, cols, f, do_scale, lo, hi):
    """x (N, H, W, C), out (N, OH, OW, C) int8 views; items (n, output row)."""
    oh, ow, c_n = out.shape[1], out.shape[2], out.shape[3]
    for item in range(lo, hi):
        n, oy = item // oh, item % oh
        src, dst = x[n, rows[oy]], out[n, oy]
        for ox in range(ow):
            s, d = src[cols[ox]], dst[ox]
            if do_scale:
                for c in range(c_n):
                    d[c] = f2i8(np.float32(s[c]) * f[c])
            else:
                for c in range(c_n):
                    d[c] = s[c]


@njit(nogil=True, cache=True)
def bilinear(x, out, h0, h1, lh, w0, w1, lw, f, do_scale, lo, hi):
    """x (N, H, W, C), out (N, OH, OW, C) int8 views; the taps and (l0, l1) weights of each axis; items
    (n, output row)."""
    oh, ow, c_n = out.shape[1], out.shape[2], out.shape[3]
    for item in range(lo, hi):
        n, oy = item // oh, item % oh
        top, bottom, dst = x[n, h0[oy]], x[n, h1[oy]], out[n, oy]
        l0h, l1h = lh[oy, 0], lh[oy, 1]
        for ox in range(ow):
            a0, a1, b0, b1 = top[w0[ox]], top[w1[ox]], bottom[w0[ox]], bottom[w1[ox]]
            l0w, l1w = lw[ox, 0], lw[ox, 1]
            d = dst[ox]
            for c in range(c_n):
                v = (np.float32(a0[c]) * l0w + np.float32(a1[c]) * l1w) * l0h \
                    + (np.float32(b0[c]) * l0w + np.float32(b1[c]) * l1w) * l1h
                d[c] = f2i8(v * f[c] if do_scale else v)


def _plan(node: Node, nchw_shape) -> tuple:
    """What a run at this (logical NCHW) input shape needs: the taps of each axis, the factors, do_scale."""
    _, c, ih, iw = nchw_shape
    oh, ow = output_size(node, nchw_shape)
    check_exact(node, nchw_shape, (oh, ow))
    f, do_scale = factors(node.attrs["in_scale"], node.attrs["out_scale"], c)
    if (ih, iw) == (oh, ow) and not do_scale:
        return ("copy",)
    if node.params["mode"] == "nearest":
        return "nearest", nearest_index(ih, oh), nearest_index(iw, ow), f, do_scale
    align = bool(node.params.get("align_corners"))
    return ("bilinear", *bilinear_taps(ih, oh, align), *bilinear_taps(iw, ow, align), f, do_scale)


def _build(channels_last: bool):
    def build(backends: Backends, node: Node, ins: list[TensorInfo]):
        cache: dict[tuple, tuple] = {}

        def run(inputs, outputs, workspace):
            x, out = inputs[0], outputs[0]
            if not channels_last:  # walk NCHW values through their NHWC views
                x, out = x.transpose(0, 2, 3, 1), out.transpose(0, 2, 3, 1)
            n, h, w, c = x.shape
            plan = cache.get(x.shape)
            if plan is None:
                plan = remember(cache, x.shape, _plan(node, (n, c, h, w)))
            if plan[0] == "copy":
                np.copyto(out, x)
                return
            fn = nearest if plan[0] == "nearest" else bilinear
            parallel_for(fn, n * out.shape[1], out.size * (4 if fn is bilinear else 1), x, out, *plan[1:])
        return run
    return build


KERNELS = {"TnnQUpsample": CpuKernel(_build(False)), "Int8UpsampleNhwc": CpuKernel(_build(True))}
