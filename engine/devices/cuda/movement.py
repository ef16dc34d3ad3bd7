"""Layout ops on CUDA through one strided-copy kernel, plus Gather and Pad.

strided_copy walks the destination's index space `shape`: element idx reads src[src_base + sum((idx_d % mod_d)
* src_stride_d)] and writes dst[dst_base + sum(idx_d * dst_stride_d)]. Transpose permutes strides, Slice scales
them by the step, Expand zeroes them, Tile wraps with `mod`, Concat/Split/Stack move the base along the axis,
PixelShuffle/ChannelShuffle are 6-d/5-d transposes, and Cast/Identity/unaliased reshapes are flat copies.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from engine.devices.cuda._launch import at_least_1d, broadcast_strides, by_shapes, flat, grid, strides_of
from engine.ir import Node
from engine.ops.pad import pad_mode, pad_plan
from engine.ops.registry import TensorInfo
from engine.ops.rules import norm_axis
from engine.ops.shape import transpose_perm
from engine.ops.tensor import slice_bounds, slice_index

BIG = 1 << 62  # a `mod` that never wraps


@cuda.jit
def strided_copy(src, src_base, src_strides, mods, dst, dst_base, dst_strides, shape, n):
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, n, step):
        rem, s, d = i, src_base, dst_base
        for k in range(len(shape) - 1, -1, -1):
            idx = rem % shape[k]
            rem //= shape[k]
            s += (idx % mods[k]) * src_strides[k]
            d += idx * dst_strides[k]
        dst[d] = src[s]


@cuda.jit
def _gather(data, idx, out, inner, dim, nidx):
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, out.size, step):
        r = i % inner
        j = (i // inner) % nidx
        o = i // (inner * nidx)
        k = idx[j]
        if k < 0:
            k += dim
        out[i] = data[(o * dim + k) * inner + r]


@cuda.jit
def _pad(x, y, in_shape, out_shape, begin, end, mode, value):
    """mode 0 constant, 1 reflect, 2 edge, 3 circular. Negative pads crop first; the modes then see the
    cropped extent, as the reference does."""
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, y.size, step):
        rem, src, stride, inside = i, 0, 1, True
        for k in range(len(out_shape) - 1, -1, -1):
            lo = -min(begin[k], 0)
            n = in_shape[k] - lo + min(end[k], 0)
            s = rem % out_shape[k] - max(begin[k], 0)
            rem //= out_shape[k]
            if s < 0 or s >= n:
                if mode == 0:
                    inside = False
                elif mode == 1:
                    s = -s if s < 0 else 2 * (n - 1) - s
                elif mode == 2:
                    s = 0 if s < 0 else n - 1
                else:
                    s = s % n
            src += (s + lo) * stride
            stride *= in_shape[k]
        y[i] = x[src] if inside else value


def copy_strided(stream, src, dst, shape, src_strides, src_base=0, dst_strides=None, dst_base=0, mods=None):
    """One launch of strided_copy; src/dst are flat device arrays, strides in elements."""
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0:
        return
    dst_strides = strides_of(shape) if dst_strides is None else dst_strides
    mods = (BIG,) * len(shape) if mods is None else mods
    shape, src_strides, dst_strides, mods = at_least_1d(tuple(shape), tuple(src_strides), tuple(dst_strides),
                                                         tuple(mods))
    strided_copy[grid(n) + (stream,)](src, src_base, src_strides, mods, dst, dst_base, dst_strides, shape, n)


def _single(plan_fn):
    """A kernel from a plan(ins, outs) -> copy_strided kwargs for input 0 -> output 0."""
    def build(dev, node: Node, ins: list[TensorInfo]):
        plan, stream = by_shapes(lambda i, o: (plan_fn(node, i, o),)), dev.stream

        def run(inputs, outputs, workspace):
            copy_strided(stream, flat(inputs[0]), flat(outputs[0]), **plan(inputs, outputs)[0])

        return run
    return build


def _flat_plan(node, ins, outs):
    n = int(np.prod(outs[0].shape, dtype=np.int64))
    return {"shape": (n,), "src_strides": (1,)}


def _transpose_plan(node, ins, outs):
    shape = np.shape(ins[0])
    st = strides_of(shape)
    return {"shape": tuple(outs[0].shape), "src_strides": tuple(st[p] for p in transpose_perm(node, len(shape)))}


def _slice_plan(node, ins, outs):
    shape = np.shape(ins[0])
    st = strides_of(shape)
    base, strides = 0, []
    # Bounds computed at run time (inputs 1-3) are host values; they may arrive as device copies.
    bounds = slice_bounds(node, [a.copy_to_host() if hasattr(a, "copy_to_host") else a for a in ins[1:]])
    for d, sl in enumerate(slice_index(node, shape, bounds)):
        first, _, step = sl.indices(shape[d])
        base += first * st[d]
        strides.append(step * st[d])
    return {"shape": tuple(outs[0].shape), "src_strides": tuple(strides), "src_base": base}


def _expand_plan(node, ins, outs):
    return {"shape": tuple(outs[0].shape), "src_strides": broadcast_strides(np.shape(ins[0]), outs[0].shape)}


def _tile_plan(node, ins, outs):
    out = tuple(outs[0].shape)
    full = (1,) * (len(out) - len(np.shape(ins[0]))) + tuple(np.shape(ins[0]))
    return {"shape": out, "src_strides": strides_of(full), "mods": full}


def _pixel_plan(node, ins, outs):
    n, c, h, w = np.shape(ins[0])
    _, oc, _, _ = outs[0].shape
    r = int(node.params["upscale"])
    # destination index space (n, oc, h, i, w, j) reads x[n, oc*r*r + i*r + j, h, w]
    hw = h * w
    return {"shape": (n, oc, h, r, w, r), "src_strides": (c * hw, r * r * hw, w, r * hw, 1, hw)}


def _shuffle_plan(node, ins, outs):
    n, c, h, w = np.shape(ins[0])
    g = int(node.params["groups"])
    hw = h * w
    # out channel j*g + i holds input channel i*(c/g) + j
    return {"shape": (n, c // g, g, hw), "src_strides": (c * hw, hw, (c // g) * hw, 1)}


def _join_plan(node, ins, outs):
    out = tuple(outs[0].shape)
    stack = node.op_type == "Stack"
    axis = norm_axis(node, int(node.params.get("axis", 0)), len(out))
    ost = strides_of(out)
    pieces, pos = [], 0
    for a in ins:
        shape = tuple(np.shape(a))
        if stack:
            dst = ost[:axis] + ost[axis + 1:]
            pieces.append((shape, dst, pos * ost[axis]))
            pos += 1
        else:
            pieces.append((shape, ost, pos * ost[axis]))
            pos += shape[axis]
    return tuple(pieces)


def build_join(dev, node: Node, ins: list[TensorInfo]):
    plan, stream = by_shapes(lambda i, o: _join_plan(node, i, o)), dev.stream

    def run(inputs, outputs, workspace):
        dst = flat(outputs[0])
        for a, (shape, dst_strides, base) in zip(inputs, plan(inputs, outputs), strict=True):
            copy_strided(stream, flat(a), dst, shape, strides_of(shape), dst_strides=dst_strides, dst_base=base)

    return run


def _split_plan(node, ins, outs):
    shape = tuple(np.shape(ins[0]))
    axis = norm_axis(node, int(node.params.get("axis", 0)), len(shape))
    st, pieces, pos = strides_of(shape), [], 0
    for o in outs:
        pieces.append((tuple(o.shape), pos * st[axis]))
        pos += o.shape[axis]
    return st, tuple(pieces)


def build_split(dev, node: Node, ins: list[TensorInfo]):
    plan, stream = by_shapes(lambda i, o: _split_plan(node, i, o)), dev.stream

    def run(inputs, outputs, workspace):
        src = flat(inputs[0])
        st, pieces = plan(inputs, outputs)
        for o, (shape, base) in zip(outputs, pieces, strict=True):
            copy_strided(stream, src, flat(o), shape, st, src_base=base)

    return run


def build_gather(dev, node: Node, ins: list[TensorInfo]):
    stream = dev.stream

    def run(inputs, outputs, workspace):
        data, idx = inputs
        axis = norm_axis(node, int(node.params.get("axis", 0)), len(data.shape))
        dim, inner = data.shape[axis], int(np.prod(data.shape[axis + 1:], dtype=np.int64))
        out = flat(outputs[0])
        nidx = max(1, int(np.prod(np.shape(idx), dtype=np.int64)))
        if out.size:
            _gather[grid(out.size) + (stream,)](flat(data), flat(idx), out, inner, dim, nidx)

    return run


_PAD_MODES = {"constant": 0, "reflect": 1, "edge": 2, "circular": 3}


def build_pad(dev, node: Node, ins: list[TensorInfo]):
    mode = _PAD_MODES[pad_mode(node)]
    value = float(node.params.get("value", 0) or 0)
    stream = dev.stream

    def run(inputs, outputs, workspace):
        shape = tuple(np.shape(inputs[0]))
        begin, end = pad_plan(node, shape)
        in_shape, out_shape, begin, end = at_least_1d(shape, tuple(outputs[0].shape), tuple(begin), tuple(end))
        y = flat(outputs[0])
        _pad[grid(y.size) + (stream,)](flat(inputs[0]), y, in_shape, out_shape, begin, end, mode, value)

    return run


KERNELS = {
    **dict.fromkeys(("Identity", "Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze"), _single(_flat_plan)),
    "Transpose": _single(_transpose_plan), "Slice": _single(_slice_plan), "Expand": _single(_expand_plan),
    "Tile": _single(_tile_plan), "PixelShuffle": _single(_pixel_plan), "ChannelShuffle": _single(_shuffle_plan),
    "Concat": build_join, "Stack": build_join, "Split": build_split, "Gather": build_gather, "Pad": build_pad,
}
