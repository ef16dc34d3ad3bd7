"""Matrix kernels on CUDA: a tiled shared-memory matmul with a fused epilogue, and the ops built on it
(Gemm, MatMul, Conv as im2col + matmul into the instance workspace).

The matmul computes, for each batch z, C[M, N] = A[M, K] @ B[K, N] where A and B are addressed through
(row, col) strides and per-batch offsets, so a transposed weight (Gemm) or a broadcast batch (MatMul) needs no
copy. Epilogue: + bias (per row or per column), + residual z, then the activation (kinds below).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from engine.devices.cuda._launch import TILE, at_least_1d, broadcast_strides, by_shapes, flat, strides_of
from engine.devices.cuda.elementwise import nan_max, nan_min
from engine.ir import Node
from engine.ops.registry import TensorInfo

ACTIVATIONS = {None: 0, "relu": 1, "relu6": 2, "leaky_relu": 3, "clip": 4, "sigmoid": 5, "silu": 6,
               "hardswish": 7, "hardsigmoid": 8, "gelu": 9, "tanh": 10, "elu": 11}


def activation_args(node: Node) -> tuple[int, float, float]:
    """(kind, p0, p1) of a node's fused activation, with _epilogue's defaults."""
    name = node.params.get("activation")
    p = node.params.get("activation_params") or {}

    def get(key, default):
        return default if p.get(key) is None else float(p[key])

    if name == "leaky_relu":
        return 3, get("alpha", 0.01), 0.0
    if name == "clip":
        return 4, get("min", -math.inf), get("max", math.inf)
    if name in ("hardswish", "hardsigmoid"):
        return ACTIVATIONS[name], get("alpha", 1 / 6), get("beta", 0.5)
    if name == "gelu":
        return 9, 1.0 if p.get("approximate", "none") == "tanh" else 0.0, 0.0
    if name == "elu":
        return 11, get("alpha", 1.0), 0.0
    return ACTIVATIONS[name], 0.0, 0.0


@cuda.jit(device=True)
def activate(v, kind, p0, p1):
    if kind == 0:
        return v
    if kind == 1:
        return nan_max(v, 0.0)
    if kind == 2:
        return nan_min(nan_max(v, 0.0), 6.0)
    if kind == 3:
        return v if v > 0 else v * p0
    if kind == 4:
        return nan_min(nan_max(v, p0), p1)
    if kind == 5:
        return 1.0 / (1.0 + math.exp(-v))
    if kind == 6:
        return v / (1.0 + math.exp(-v))
    if kind == 7:
        return v * nan_min(nan_max(p0 * v + p1, 0.0), 1.0)
    if kind == 8:
        return nan_min(nan_max(p0 * v + p1, 0.0), 1.0)
    if kind == 9:
        if p0 > 0:
            return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v * v * v)))
        return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))
    if kind == 10:
        return math.tanh(v)
    return v if v > 0 else p0 * math.expm1(v)


@cuda.jit
def matmul(a, b, c, M, N, K, bshape, a_bs, b_bs, c_bs, a_rs, a_cs, b_rs, b_cs, a_base, b_base, c_base,
           bias, bias_mode, z, has_z, act, p0, p1):
    sa = cuda.shared.array((TILE, TILE), float32)
    sb = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row = cuda.blockIdx.y * TILE + ty
    col = cuda.blockIdx.x * TILE + tx
    batch = cuda.blockIdx.z
    ao, bo, co, rem = a_base, b_base, c_base, batch
    for d in range(len(bshape) - 1, -1, -1):
        idx = rem % bshape[d]
        rem //= bshape[d]
        ao += idx * a_bs[d]
        bo += idx * b_bs[d]
        co += idx * c_bs[d]
    acc = float32(0.0)
    for t in range((K + TILE - 1) // TILE):
        k = t * TILE + tx
        sa[ty, tx] = a[ao + row * a_rs + k * a_cs] if row < M and k < K else 0.0
        k = t * TILE + ty
        sb[ty, tx] = b[bo + k * b_rs + col * b_cs] if k < K and col < N else 0.0
        cuda.syncthreads()
        for kk in range(TILE):
            acc += sa[ty, kk] * sb[kk, tx]
        cuda.syncthreads()
    if row < M and col < N:
        v = acc * 1.0
        if bias_mode == 1:  # per output row; a conv's batch z is its group, rows continue across groups
            v += bias[(co - c_base) // N + row]
        elif bias_mode == 2:
            v += bias[col]
        i = co + row * N + col
        if has_z:
            v += z[i]
        c[i] = activate(v, act, p0, p1)


def launch_matmul(stream, a, b, c, M, N, K, *, batch=((1,), (0,), (0,), (0,)), a_rs, a_cs, b_rs, b_cs,
                  a_base=0, b_base=0, c_base=0, bias=None, bias_mode=0, z=None, act=(0, 0.0, 0.0)):
    bshape, a_bs, b_bs, c_bs = batch
    nb = int(np.prod(bshape, dtype=np.int64))
    blocks = (math.ceil(N / TILE), math.ceil(M / TILE), nb)
    bias = c if bias is None else bias
    matmul[blocks, (TILE, TILE), stream](a, b, c, M, N, K, bshape, a_bs, b_bs, c_bs, a_rs, a_cs, b_rs, b_cs,
                                         a_base, b_base, c_base, bias, bias_mode,
                                         c if z is None else z, z is not None, *act)


def _check_f32(dev, node: Node, ins: list[TensorInfo]) -> None:
    for t in ins:
        if np.dtype(t.dtype) != np.float32:
            dev.refuse(node, f"{node.op_type} on {np.dtype(t.dtype).name} inputs (the CUDA matmul is float32)")


def build_gemm(dev, node: Node, ins: list[TensorInfo]):
    _check_f32(dev, node, ins)
    w = np.ascontiguousarray(node.attrs["weight"], np.float32)
    n_out, k = w.shape
    d_w, bias = flat(dev.upload(w)), node.attrs.get("bias")
    d_b = dev.upload(np.ascontiguousarray(bias, np.float32).reshape(-1)) if bias is not None else None
    act, stream = activation_args(node), dev.stream

    def run(inputs, outputs, workspace):
        x, y = flat(inputs[0]), flat(outputs[0])
        rows = x.size // k
        z = flat(inputs[1]) if len(inputs) > 1 else None  # the residual fuse_epilogue folded in
        launch_matmul(stream, x, d_w, y, rows, n_out, k, a_rs=k, a_cs=1, b_rs=1, b_cs=k, bias=d_b,
                      bias_mode=2 if d_b is not None else 0, z=z, act=act)

    return run


def _matmul_plan(ins, outs):
    sa, sb = tuple(np.shape(ins[0])), tuple(np.shape(ins[1]))
    a2 = (1,) + sa if len(sa) == 1 else sa
    b2 = sb + (1,) if len(sb) == 1 else sb
    m, k, n = a2[-2], a2[-1], b2[-1]
    bshape = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    a_bs = broadcast_strides(a2[:-2], bshape) if bshape else ()
    b_bs = broadcast_strides(b2[:-2], bshape) if bshape else ()
    c_bs = tuple(s * m * n for s in strides_of(bshape))
    a_bs = tuple(s * m * k for s in a_bs)
    b_bs = tuple(s * k * n for s in b_bs)
    return m, n, k, at_least_1d(bshape, a_bs, b_bs, c_bs)


def build_matmul(dev, node: Node, ins: list[TensorInfo]):
    _check_f32(dev, node, ins)
    plan, stream = by_shapes(_matmul_plan), dev.stream

    def run(inputs, outputs, workspace):
        m, n, k, batch = plan(inputs, outputs)
        launch_matmul(stream, flat(inputs[0]), flat(inputs[1]), flat(outputs[0]), m, n, k, batch=batch,
                      a_rs=k, a_cs=1, b_rs=n, b_cs=1)

    return run
