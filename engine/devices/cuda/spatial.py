"""Pooling and Resize on CUDA: one thread per output pixel.

Pool geometry (pads, ceil_mode, auto_pad) comes from engine.ops.pool and Resize's source taps from
engine.ops.resize, so the CUDA kernels share the exact coordinate rules of the numpy references.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from engine.devices.cuda._launch import by_shapes, flat, grid
from engine.devices.cuda.elementwise import nan_max
from engine.ir import Node
from engine.ops.pool import adaptive_size, pool_geom
from engine.ops.registry import TensorInfo
from engine.ops.resize import taps


@cuda.jit
def _pool(x, y, H, W, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, is_max, include, divisor):
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, y.size, step):
        ox, oy, plane = i % ow, (i // ow) % oh, i // (ow * oh)
        y0, x0 = oy * sh - pt, ox * sw - pl
        acc, best, count = 0.0, -math.inf, 0
        for ki in range(kh):
            iy = y0 + ki * dh
            if iy < 0 or iy >= H:
                continue
            for kj in range(kw):
                ix = x0 + kj * dw
                if ix < 0 or ix >= W:
                    continue
                v = x[(plane * H + iy) * W + ix]
                acc += v
                best = nan_max(best, v)
                count += 1
        if is_max:
            y[i] = best
        else:
            if divisor > 0:
                d = divisor
            elif include:  # torch counts pads, but not the part of a ceil_mode window past the end pad
                d = (min(y0 + kh, H + pb) - y0) * (min(x0 + kw, W + pr) - x0)
            else:
                d = count
            y[i] = acc / d


def build_pool(dev, node: Node, ins: list[TensorInfo]):
    is_max, stream = node.op_type == "MaxPool", dev.stream
    include = bool(node.params.get("count_include_pad", True))
    divisor = int(node.params.get("divisor_override") or 0)
    plan = by_shapes(lambda i, o: (pool_geom(node, np.shape(i[0])),))

    def run(inputs, outputs, workspace):
        (g,) = plan(inputs, outputs)
        y = flat(outputs[0])
        _pool[grid(y.size) + (stream,)](flat(inputs[0]), y, g.h, g.w, g.oh, g.ow, *g.kernel, *g.stride,
                                        *g.dilation, *g.pads, is_max, include, divisor)

    return run


@cuda.jit
def _adaptive(x, y, H, W, oh, ow, is_max):
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, y.size, step):
        ox, oy, plane = i % ow, (i // ow) % oh, i // (ow * oh)
        h0, h1 = oy * H // oh, -(-(oy + 1) * H // oh)
        w0, w1 = ox * W // ow, -(-(ox + 1) * W // ow)
        acc, best = 0.0, -math.inf
        for iy in range(h0, h1):
            for ix in range(w0, w1):
                v = x[(plane * H + iy) * W + ix]
                acc += v
                best = nan_max(best, v)
        y[i] = best if is_max else acc / ((h1 - h0) * (w1 - w0))


def build_adaptive(dev, node: Node, ins: list[TensorInfo]):
    is_max, stream = "Max" in node.op_type, dev.stream
    is_global = node.op_type.startswith("Global")

    def run(inputs, outputs, workspace):
        _, _, h, w = np.shape(inputs[0])
        oh, ow = (1, 1) if is_global else adaptive_size(node, np.shape(inputs[0]))
        y = flat(outputs[0])
        _adaptive[grid(y.size) + (stream,)](flat(inputs[0]), y, h, w, oh, ow, is_max)

    return run


@cuda.jit
def _resize(x, y, H, W, oh, ow, iy, wy, ty, ix, wx, tx):
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, y.size, step):
        ox, oy, plane = i % ow, (i // ow) % oh, i // (ow * oh)
        acc = 0.0
        for a in range(ty):
            row = (plane * H + iy[oy * ty + a]) * W
            for b in range(tx):
                acc += wy[oy * ty + a] * wx[ox * tx + b] * x[row + ix[ox * tx + b]]
        y[i] = acc


def build_resize(dev, node: Node, ins: list[TensorInfo]):
    stream = dev.stream
    has_size = len(node.inputs) > 1 or node.params.get("size") is not None

    def plan(inputs, outputs):
        _, _, h, w = np.shape(inputs[0])
        _, _, oh, ow = outputs[0].shape
        iy, wy = taps(node, 0, h, oh, has_size)
        ix, wx = taps(node, 1, w, ow, has_size)
        # tables for a new input shape are uploaded once and kept for later runs at that shape
        up = [dev.upload(np.ascontiguousarray(t).reshape(-1)) for t in (iy, wy, ix, wx)]
        return h, w, oh, ow, up[0], up[1], iy.shape[1], up[2], up[3], ix.shape[1]

    plan = by_shapes(plan)

    def run(inputs, outputs, workspace):
        y = flat(outputs[0])
        _resize[grid(y.size) + (stream,)](flat(inputs[0]), y, *plan(inputs, outputs))

    return run


KERNELS = {"MaxPool": build_pool, "AvgPool": build_pool, "AdaptiveAvgPool": build_adaptive,
           "AdaptiveMaxPool": build_adaptive, "GlobalAvgPool": build_adaptive, "GlobalMaxPool": build_adaptive}
KERNELS["Resize"] = build_resize
