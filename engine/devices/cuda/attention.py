"""Attention on CUDA: one thread per (batch, query row), two passes over the keys (max, then an exp-weighted
sum of v rows written straight into the output row), so no scores buffer is needed.

Batch dims of q, k, v and the mask broadcast through per-operand strides. A bool mask means "may attend"; a
float mask is added; is_causal blocks key j > query i (torch's top-left aligned tril), as the reference does.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from engine.devices.cuda._launch import at_least_1d, broadcast_strides, by_shapes, flat, grid
from engine.ir import Node
from engine.ops.attention import nan_rows
from engine.ops.registry import TensorInfo


@cuda.jit(device=True)
def _score(q, k, mask, qo, ko, mo, j, E, ks, scale, mode, causal, i):
    if causal and j > i:
        return -math.inf
    if mode == 1 and not mask[mo + j * ks]:
        return -math.inf
    s = 0.0
    for e in range(E):
        s += q[qo + e] * k[ko + j * E + e]
    s *= scale
    if mode == 2:
        s += mask[mo + j * ks]
    return s


@cuda.jit
def _attention(q, k, v, mask, y, bshape, qs, ks_, vs, ms, L, S, E, Ev, mrs, mcs, scale, mode, causal, nan_rows):
    start, step = cuda.grid(1), cuda.gridsize(1)
    for r in range(start, y.size // Ev, step):
        i, b = r % L, r // L
        qo, ko, vo, mo, rem = 0, 0, 0, 0, b
        for d in range(len(bshape) - 1, -1, -1):
            idx = rem % bshape[d]
            rem //= bshape[d]
            qo += idx * qs[d]
            ko += idx * ks_[d]
            vo += idx * vs[d]
            mo += idx * ms[d]
        qo += i * E
        mo += i * mrs
        m = -math.inf
        for j in range(S):
            m = max(m, _score(q, k, mask, qo, ko, mo, j, E, mcs, scale, mode, causal, i))
        out = r * Ev
        for e in range(Ev):
            y[out + e] = 0.0
        if not math.isfinite(m):  # every key blocked: zeros, or NaN as the node says (masked_rows)
            if nan_rows:
                for e in range(Ev):
                    y[out + e] = math.nan
            continue
        total = 0.0
        for j in range(S):
            p = math.exp(_score(q, k, mask, qo, ko, mo, j, E, mcs, scale, mode, causal, i) - m)
            total += p
            for e in range(Ev):
                y[out + e] += p * v[vo + j * Ev + e]
        for e in range(Ev):
            y[out + e] /= total


def _plan(node: Node, ins, outs):
    q, k, v = (tuple(np.shape(a)) for a in ins[:3])
    out = tuple(outs[0].shape)
    batch = out[:-2]
    L, S, E, Ev = q[-2], k[-2], q[-1], v[-1]
    strides = [tuple(s * m for s in broadcast_strides(t[:-2], batch)) if batch else ()
               for t, m in ((q, L * E), (k, S * E), (v, S * Ev))]
    mode, ms, mrs, mcs = 0, (0,) * len(batch), 0, 0
    if len(ins) > 3:
        mode = 1 if ins[3].dtype == np.bool_ else 2
        full = broadcast_strides(np.shape(ins[3]), batch + (L, S))
        ms, mrs, mcs = full[:-2], full[-2], full[-1]
    scale = node.params.get("scale")
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)
    return (*at_least_1d(batch, *strides, ms), L, S, E, Ev, mrs, mcs, scale, mode)


def build_attention(dev, node: Node, ins: list[TensorInfo]):
    causal, stream = bool(node.params.get("is_causal", False)), dev.stream
    empty_rows_nan = nan_rows(node)
    plan = by_shapes(lambda i, o: _plan(node, i, o))

    def run(inputs, outputs, workspace):
        y = flat(outputs[0])
        mask = flat(inputs[3]) if len(inputs) > 3 else y
        args = plan(inputs, outputs)
        rows = max(1, y.size // args[8])
        _attention[grid(rows) + (stream,)](*(flat(a) for a in inputs[:3]), mask, y, *args, causal, empty_rows_nan)

    return run


KERNELS = {"Attention": build_attention}
