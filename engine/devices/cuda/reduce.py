"""Reductions, ArgMax/ArgMin, Softmax/LogSoftmax and the norms on CUDA: one thread per output row.

Rows are described by (kept shape, kept strides) for the thread's base offset and (reduced shape, reduced
strides) for the loop inside it, so any set of axes reduces without a transpose. Accumulation is float64.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from engine.devices.cuda._launch import at_least_1d, by_shapes, flat, grid, strides_of
from engine.devices.cuda.elementwise import nan_max
from engine.ir import Node
from engine.ops.registry import TensorInfo
from engine.ops.rules import norm_axes, norm_axis

KINDS = {"ReduceSum": 0, "ReduceMean": 1, "ReduceMax": 2, "ReduceMin": 3, "ReduceProd": 4, "ReduceL1": 5,
         "ReduceL2": 6, "ReduceSumSquare": 7, "ReduceLogSum": 8, "ReduceLogSumExp": 9, "ArgMax": 10, "ArgMin": 11}


@cuda.jit(device=True)
def _offset(i, shape, strides):
    off = 0
    for k in range(len(shape) - 1, -1, -1):
        off += (i % shape[k]) * strides[k]
        i //= shape[k]
    return off


@cuda.jit
def _reduce(x, y, kshape, kstrides, rshape, rstrides, nred, kind):
    start, step = cuda.grid(1), cuda.gridsize(1)
    for o in range(start, y.size, step):
        base = _offset(o, kshape, kstrides)
        first = x[base]
        acc, best, arg = 0.0, first * 1.0, 0
        if kind == 4:
            acc = 1.0
        for r in range(nred):
            v = x[base + _offset(r, rshape, rstrides)] * 1.0
            if kind == 0 or kind == 1:
                acc += v
            elif kind == 4:
                acc *= v
            elif kind == 5:
                acc += abs(v)
            elif kind == 6 or kind == 7:
                acc += v * v
            elif kind == 8:
                acc += v
            elif (kind == 2 or kind == 10 or kind == 9) and (v > best or (v != v and best == best)):
                best, arg = v, r  # the first NaN wins and stays, as in torch's max / argmax
            elif (kind == 3 or kind == 11) and (v < best or (v != v and best == best)):
                best, arg = v, r
        if kind == 9:
            m = best if math.isfinite(best) else 0.0
            for r in range(nred):
                acc += math.exp(x[base + _offset(r, rshape, rstrides)] - m)
            y[o] = math.log(acc) + m
        elif kind == 1:
            y[o] = acc / nred
        elif kind == 6:
            y[o] = math.sqrt(acc)
        elif kind == 8:
            y[o] = math.log(acc)
        elif kind == 2 or kind == 3:
            y[o] = best
        elif kind == 10 or kind == 11:
            y[o] = arg
        else:
            y[o] = acc


def _reduce_plan(node: Node, shape: tuple[int, ...]) -> tuple:
    if node.op_type in ("ArgMax", "ArgMin"):
        axis = node.params.get("axis")
        axes = tuple(range(len(shape))) if axis is None else (norm_axis(node, int(axis), len(shape)),)
    else:
        axes = norm_axes(node, node.params.get("axes"), len(shape))
    st = strides_of(shape)
    kshape = tuple(d for i, d in enumerate(shape) if i not in axes)
    kst = tuple(s for i, s in enumerate(st) if i not in axes)
    rshape = tuple(shape[i] for i in axes)
    rst = tuple(st[i] for i in axes)
    kshape, kst = at_least_1d(kshape, kst)
    rshape, rst = at_least_1d(rshape, rst)
    return kshape, kst, rshape, rst, int(np.prod(rshape, dtype=np.int64))


def build_reduce(dev, node: Node, ins: list[TensorInfo]):
    kind, stream = KINDS[node.op_type], dev.stream
    plan = by_shapes(lambda i, o: _reduce_plan(node, tuple(np.shape(i[0]))))

    def run(inputs, outputs, workspace):
        y = flat(outputs[0])
        _reduce[grid(y.size) + (stream,)](flat(inputs[0]), y, *plan(inputs, outputs), kind)

    return run


@cuda.jit
def _softmax(x, y, n, inner, log):
    start, step = cuda.grid(1), cuda.gridsize(1)
    rows = x.size // n
    for row in range(start, rows, step):
        base = (row // inner) * n * inner + row % inner
        m = -math.inf
        for j in range(n):
            m = max(m, x[base + j * inner])
        m = m if math.isfinite(m) else 0.0
        total = 0.0
        for j in range(n):
            total += math.exp(x[base + j * inner] - m)
        for j in range(n):
            v = x[base + j * inner] - m
            y[base + j * inner] = v - math.log(total) if log else math.exp(v) / total


def build_softmax(dev, node: Node, ins: list[TensorInfo]):
    log, stream = node.op_type == "LogSoftmax", dev.stream

    def run(inputs, outputs, workspace):
        shape = tuple(outputs[0].shape) or (1,)
        axis = norm_axis(node, int(node.params.get("axis", -1)), len(shape))
        n, inner = shape[axis], int(np.prod(shape[axis + 1:], dtype=np.int64))
        y = flat(outputs[0])
        _softmax[grid(y.size // max(n, 1)) + (stream,)](flat(inputs[0]), y, n, inner, log)

    return run


@cuda.jit
def _group_norm(x, y, span, groups_per_row, inner, w, b, has_w, has_b, eps):
    """Normalizes contiguous spans of `span` values; affine index = (i // inner) % len(w) (channel or column)."""
    start, step = cuda.grid(1), cuda.gridsize(1)
    for g in range(start, x.size // span, step):
        base = g * span
        mean = 0.0
        for j in range(span):
            mean += x[base + j]
        mean /= span
        var = 0.0
        for j in range(span):
            d = x[base + j] - mean
            var += d * d
        inv = 1.0 / math.sqrt(var / span + eps)
        for j in range(span):
            i = base + j
            c = ((g % groups_per_row) * span + j) // inner
            v = (x[i] - mean) * inv
            if has_w:
                v *= w[c]
            if has_b:
                v += b[c]
            y[i] = v


def build_norm(dev, node: Node, ins: list[TensorInfo]):
    w, b = node.attrs.get("weight"), node.attrs.get("bias")
    d_w = dev.upload(np.ascontiguousarray(w, np.float32).reshape(-1)) if w is not None else dev.dummy
    d_b = dev.upload(np.ascontiguousarray(b, np.float32).reshape(-1)) if b is not None else dev.dummy
    eps, stream = float(node.params.get("eps", 1e-5)), dev.stream

    def plan(inputs, outputs):
        shape = tuple(outputs[0].shape)
        if node.op_type == "LayerNorm":
            k = int(node.params.get("normalized_ndim", 1))
            span = int(np.prod(shape[len(shape) - k:], dtype=np.int64))
            return span, 1, 1  # weight index = position inside the row
        groups = shape[1] if node.op_type == "InstanceNorm" else int(node.params["num_groups"])
        inner = int(np.prod(shape[2:], dtype=np.int64))
        return (shape[1] // groups) * inner, groups, inner

    plan = by_shapes(plan)

    def run(inputs, outputs, workspace):
        span, groups, inner = plan(inputs, outputs)
        y = flat(outputs[0])
        _group_norm[grid(y.size // span) + (stream,)](flat(inputs[0]), y, span, groups, inner, d_w, d_b,
                                                      w is not None, b is not None, eps)

    return run


@cuda.jit
def _lp_norm(x, y, n, inner, p, eps):
    start, step = cuda.grid(1), cuda.gridsize(1)
    for row in range(start, x.size // n, step):
        base = (row // inner) * n * inner + row % inner
        total = 0.0
        for j in range(n):
            v = x[base + j * inner]
            total += abs(v) if p == 1 else v * v
        norm = nan_max(total if p == 1 else math.sqrt(total), eps)  # a NaN row stays NaN, not x / eps
        for j in range(n):
            y[base + j * inner] = x[base + j * inner] / norm


def build_lp(dev, node: Node, ins: list[TensorInfo]):
    p, eps, stream = int(node.params.get("p", 2)), float(node.params.get("eps", 1e-12)), dev.stream

    def run(inputs, outputs, workspace):
        shape = tuple(outputs[0].shape)
        axis = norm_axis(node, int(node.params.get("axis", 1)), len(shape))
        n, inner = shape[axis], int(np.prod(shape[axis + 1:], dtype=np.int64))
        y = flat(outputs[0])
        _lp_norm[grid(y.size // n) + (stream,)](flat(inputs[0]), y, n, inner, p, eps)

    return run


KERNELS = {**dict.fromkeys(KINDS, build_reduce), "Softmax": build_softmax, "LogSoftmax": build_softmax,
           **dict.fromkeys(("LayerNorm", "GroupNorm", "InstanceNorm"), build_norm), "LpNormalize": build_lp}
