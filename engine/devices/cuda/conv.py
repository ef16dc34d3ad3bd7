"""Convolutions on CUDA. Conv: im2col of one sample into the instance workspace (all groups at once), then the
tiled matmul batched over groups with bias, residual and activation fused; 1x1 stride-1 unpadded convs skip
im2col. Depthwise convs (one input channel per group) would leave a matmul tile almost empty, so they run a
direct kernel instead, as does ConvTranspose (one thread per output pixel, no workspace).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from engine.devices.cuda._launch import by_shapes, flat, grid
from engine.devices.cuda.linalg import _check_f32, activate, activation_args, launch_matmul
from engine.ir import Node
from engine.ops.conv_geometry import conv_geom, tconv_geom
from engine.ops.registry import TensorInfo

PAD_MODES = {"zeros": 0, "reflect": 1, "replicate": 2, "circular": 3}


@cuda.jit(device=True)
def _wrap(i, n, mode):
    """Source index for a padded position (-1: a zero pad)."""
    if 0 <= i < n:
        return i
    if mode == 0:
        return -1
    if mode == 1:
        return -i if i < 0 else 2 * (n - 1) - i
    if mode == 2:
        return 0 if i < 0 else n - 1
    return i % n


@cuda.jit
def _im2col(x, x_base, cols, C, H, W, cpg, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, mode, n):
    start, step = cuda.grid(1), cuda.gridsize(1)
    P, K = oh * ow, cpg * kh * kw
    for i in range(start, n, step):
        p = i % P
        kidx = (i // P) % K
        c = (i // (K * P)) * cpg + kidx // (kh * kw)
        iy = _wrap((p // ow) * sh - pt + ((kidx // kw) % kh) * dh, H, mode)
        ix = _wrap((p % ow) * sw - pl + (kidx % kw) * dw, W, mode)
        cols[i] = x[x_base + (c * H + iy) * W + ix] if iy >= 0 and ix >= 0 else 0.0


@cuda.jit
def _depthwise(x, w, bias, has_bias, z, has_z, y, C, H, W, O, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, mode,
               act, p0, p1):
    start, step = cuda.grid(1), cuda.gridsize(1)
    mult = O // C
    for i in range(start, y.size, step):
        ox = i % ow
        oy = (i // ow) % oh
        o = (i // (ow * oh)) % O
        plane = (i // (ow * oh * O)) * C + o // mult
        acc = bias[o] * 1.0 if has_bias else 0.0
        for ki in range(kh):
            iy = _wrap(oy * sh - pt + ki * dh, H, mode)
            if iy < 0:
                continue
            for kj in range(kw):
                ix = _wrap(ox * sw - pl + kj * dw, W, mode)
                if ix >= 0:
                    acc += x[(plane * H + iy) * W + ix] * w[(o * kh + ki) * kw + kj]
        if has_z:
            acc += z[i]
        y[i] = activate(acc, act, p0, p1)


def _is_depthwise(node: Node) -> bool:
    return int(node.params.get("groups", 1) or 1) > 1 and node.attrs["weight"].shape[1] == 1


def _direct(geo) -> bool:
    return (geo.kh, geo.kw, geo.stride, geo.pads) == (1, 1, (1, 1), (0, 0, 0, 0))


def conv_workspace(node: Node, ins: list[TensorInfo]) -> int:
    geo = conv_geom(node, ins[0].shape)
    return 0 if _direct(geo) or _is_depthwise(node) else geo.c * geo.kh * geo.kw * geo.oh * geo.ow * 4


def build_conv(dev, node: Node, ins: list[TensorInfo]):
    _check_f32(dev, node, ins[:1])
    w = np.ascontiguousarray(node.attrs["weight"], np.float32)
    bias = node.attrs.get("bias")
    d_w = dev.upload(w.reshape(-1))
    d_b = dev.upload(np.ascontiguousarray(bias, np.float32).reshape(-1)) if bias is not None else None
    act, stream, mode = activation_args(node), dev.stream, PAD_MODES[node.params.get("pad_mode") or "zeros"]
    plan = by_shapes(lambda i, o: (conv_geom(node, np.shape(i[0])),))
    if _is_depthwise(node):
        return _build_depthwise(dev, node, d_w, d_b, act, mode, plan)

    def run(inputs, outputs, workspace):
        (geo,) = plan(inputs, outputs)
        x, y = flat(inputs[0]), flat(outputs[0])
        z = flat(inputs[1]) if len(inputs) > 1 else None
        g, cpg, og, P = geo.groups, geo.c // geo.groups, geo.o // geo.groups, geo.oh * geo.ow
        K, HW = cpg * geo.kh * geo.kw, geo.h * geo.w
        cols = workspace.view(np.float32) if not _direct(geo) else None
        for n in range(geo.n):
            x_base = n * geo.c * HW
            if cols is None:
                src, b_base, b_bs = x, x_base, cpg * HW
            else:
                total = g * K * P
                _im2col[grid(total) + (stream,)](x, x_base, cols, geo.c, geo.h, geo.w, cpg, geo.kh, geo.kw,
                                                 *geo.stride, *geo.dilation, geo.pads[0], geo.pads[1],
                                                 geo.oh, geo.ow, mode, total)
                src, b_base, b_bs = cols, 0, K * P
            launch_matmul(stream, d_w, src, y, og, P, K, batch=((g,), (og * K,), (b_bs,), (og * P,)),
                          a_rs=K, a_cs=1, b_rs=P, b_cs=1, b_base=b_base, c_base=n * geo.o * P,
                          bias=d_b, bias_mode=1 if d_b is not None else 0, z=z, act=act)

    return run


def _build_depthwise(dev, node: Node, d_w, d_b, act, mode, plan):
    stream, has_bias = dev.stream, d_b is not None
    d_b = d_b if has_bias else dev.dummy

    def run(inputs, outputs, workspace):
        (g,) = plan(inputs, outputs)
        y = flat(outputs[0])
        z = flat(inputs[1]) if len(inputs) > 1 else y
        _depthwise[grid(y.size) + (stream,)](flat(inputs[0]), d_w, d_b, has_bias, z, len(inputs) > 1, y, g.c, g.h,
                                             g.w, g.o, g.kh, g.kw, *g.stride, *g.dilation, g.pads[0], g.pads[1],
                                             g.oh, g.ow, mode, *act)

    return run


@cuda.jit
def _tconv(x, w, bias, has_bias, y, C, H, W, O, opg, cpg, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, act, p0, p1):
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, y.size, step):
        ox = i % ow
        oy = (i // ow) % oh
        o = (i // (ow * oh)) % O
        n = i // (ow * oh * O)
        g, oo = o // opg, o % opg
        acc = bias[o] * 1.0 if has_bias else 0.0
        for ki in range(kh):
            ty = oy + pt - ki * dh
            if ty < 0 or ty % sh != 0 or ty // sh >= H:
                continue
            for kj in range(kw):
                tx = ox + pl - kj * dw
                if tx < 0 or tx % sw != 0 or tx // sw >= W:
                    continue
                for cc in range(cpg):
                    c = g * cpg + cc
                    acc += x[((n * C + c) * H + ty // sh) * W + tx // sw] * w[((c * opg + oo) * kh + ki) * kw + kj]
        y[i] = activate(acc, act, p0, p1)


def build_tconv(dev, node: Node, ins: list[TensorInfo]):
    w = np.ascontiguousarray(node.attrs["weight"], np.float32)
    bias = node.attrs.get("bias")
    d_w = dev.upload(w.reshape(-1))
    d_b = dev.upload(np.ascontiguousarray(bias, np.float32).reshape(-1)) if bias is not None else dev.dummy
    act, stream = activation_args(node), dev.stream
    plan = by_shapes(lambda i, o: (tconv_geom(node, np.shape(i[0])),))

    def run(inputs, outputs, workspace):
        (geo,) = plan(inputs, outputs)
        y = flat(outputs[0])
        _tconv[grid(y.size) + (stream,)](flat(inputs[0]), d_w, d_b, bias is not None, y, geo.c, geo.h, geo.w,
                                         geo.o, geo.o // geo.groups, geo.c // geo.groups, geo.kh, geo.kw,
                                         *geo.stride, *geo.dilation, geo.pads[0], geo.pads[1], geo.oh, geo.ow,
                                         *act)

    return run


KERNELS = {"Conv": build_conv, "ConvTranspose": build_tconv}
WORKSPACE = {"Conv": conv_workspace}
