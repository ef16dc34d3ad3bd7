"""Pooling (NCHW): MaxPool, AvgPool, GlobalAvgPool, GlobalMaxPool, AdaptiveAvgPool, AdaptiveMaxPool.

Semantics are torch's: ceil_mode drops a last window that would start in the end padding, AvgPool's divisor
counts the window clipped to the pads (count_include_pad) or to the input, adaptive bins are
[floor(i*in/out), ceil((i+1)*in/out)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.spatial import auto_pads, check_rank, out_size, pair


@dataclass(frozen=True)
class PoolGeom:
    n: int
    c: int
    h: int
    w: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pads: tuple[int, int, int, int]
    oh: int
    ow: int


def pool_geom(node: Node, shape) -> PoolGeom:
    check_rank(node, shape, 4)
    n, c, h, w = (int(d) for d in shape)
    kernel = pair(node, "kernel", 0)
    if min(kernel) <= 0:
        raise ShapeError(f"{node.where()}: {node.op_type} needs a positive kernel, got {kernel}")
    stride = kernel if node.params.get("stride") in (None, [], ()) else pair(node, "stride", 1)
    dil = pair(node, "dilation", 1) if node.op_type == "MaxPool" else (1, 1)
    pads = auto_pads(node, (h, w), kernel, stride, dil)
    ceil = bool(node.params.get("ceil_mode", False))
    oh = out_size(node, h, kernel[0], stride[0], dil[0], pads[0], pads[2], ceil)
    ow = out_size(node, w, kernel[1], stride[1], dil[1], pads[1], pads[3], ceil)
    return PoolGeom(n, c, h, w, kernel, stride, dil, pads, oh, ow)


def _padded(x: np.ndarray, geo: PoolGeom, fill: float) -> np.ndarray:
    """x padded by the pads, plus whatever the last (ceil_mode) window reaches past the end pad."""
    (kh, kw), (sh, sw), (dh, dw) = geo.kernel, geo.stride, geo.dilation
    t, l, b, r = geo.pads
    b = max(b, (geo.oh - 1) * sh + (kh - 1) * dh + 1 - geo.h - t)
    r = max(r, (geo.ow - 1) * sw + (kw - 1) * dw + 1 - geo.w - l)
    return np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)), constant_values=fill)


def _windows(xp: np.ndarray, geo: PoolGeom) -> np.ndarray:
    (kh, kw), (sh, sw), (dh, dw) = geo.kernel, geo.stride, geo.dilation
    span = ((kh - 1) * dh + 1, (kw - 1) * dw + 1)
    win = sliding_window_view(xp, span, axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    return win[:, :, :geo.oh, :geo.ow]


def _lowest(dtype) -> float:
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def maxpool_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = arrays[0]
    geo = pool_geom(node, x.shape)
    win = _windows(_padded(x, geo, _lowest(x.dtype)), geo)
    return [np.ascontiguousarray(win.max(axis=(-2, -1)))]


def _avg_divisor(node: Node, geo: PoolGeom) -> np.ndarray:
    override = node.params.get("divisor_override")
    if override:
        return np.full((geo.oh, geo.ow), float(override))
    include = node.params.get("count_include_pad", True)
    sizes = []
    for o, k, s, p0, p1, n in ((geo.oh, geo.kernel[0], geo.stride[0], geo.pads[0], geo.pads[2], geo.h),
                               (geo.ow, geo.kernel[1], geo.stride[1], geo.pads[1], geo.pads[3], geo.w)):
        start = np.arange(o) * s - p0
        end = np.minimum(start + k, n + p1)
        sizes.append(end - start if include else np.minimum(end, n) - np.maximum(start, 0))
    return np.outer(sizes[0], sizes[1]).astype(np.float64)


def avgpool_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = arrays[0]
    geo = pool_geom(node, x.shape)
    sums = _windows(_padded(x.astype(np.float64), geo, 0.0), geo).sum(axis=(-2, -1))
    return [(sums / _avg_divisor(node, geo)).astype(x.dtype)]


def infer_pool(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    geo = pool_geom(node, ins[0].shape)
    return [TensorInfo((geo.n, geo.c, geo.oh, geo.ow), ins[0].dtype)]


# -- global and adaptive ----------------------------------------------------------------------------
def infer_global(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins[0].shape) < 3:
        raise ShapeError(f"{node.where()}: {node.op_type} expects (N, C, spatial...), got {tuple(ins[0].shape)}")
    return [TensorInfo(tuple(ins[0].shape[:2]) + (1,) * (len(ins[0].shape) - 2), ins[0].dtype)]


def global_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = arrays[0]
    infer_global(node, [TensorInfo(x.shape, x.dtype)])
    axes = tuple(range(2, x.ndim))
    if node.op_type == "GlobalMaxPool":
        return [x.max(axis=axes, keepdims=True)]
    return [x.astype(np.float64).mean(axis=axes, keepdims=True).astype(x.dtype)]


def adaptive_size(node: Node, shape) -> tuple[int, int]:
    check_rank(node, shape, 4)
    size = node.params.get("output_size")
    if size is None or isinstance(size, int):
        size = (size, size)
    if len(size) != 2:
        raise ShapeError(f"{node.where()}: {node.op_type} output_size={size} is not an (h, w) pair")
    oh, ow = (int(shape[2 + i]) if s is None else int(s) for i, s in enumerate(size))
    if oh <= 0 or ow <= 0:
        raise ShapeError(f"{node.where()}: {node.op_type} output_size ({oh}, {ow}) must be positive")
    return oh, ow


def infer_adaptive(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    oh, ow = adaptive_size(node, ins[0].shape)
    return [TensorInfo(tuple(ins[0].shape[:2]) + (oh, ow), ins[0].dtype)]


def adaptive_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = arrays[0]
    oh, ow = adaptive_size(node, x.shape)
    h, w = x.shape[2:]
    reduce = np.max if node.op_type == "AdaptiveMaxPool" else np.mean
    out = np.empty(x.shape[:2] + (oh, ow), np.float64)
    for i in range(oh):
        h0, h1 = i * h // oh, -(-(i + 1) * h // oh)
        for j in range(ow):
            w0, w1 = j * w // ow, -(-(j + 1) * w // ow)
            out[:, :, i, j] = reduce(x[:, :, h0:h1, w0:w1].astype(np.float64), axis=(2, 3))
    return [out.astype(x.dtype)]


register(
    OpDef("MaxPool", infer_pool, maxpool_reference, arity=(1, 1), float_inputs=(0,)),
    OpDef("AvgPool", infer_pool, avgpool_reference, arity=(1, 1), float_inputs=(0,)),
    OpDef("GlobalAvgPool", infer_global, global_reference, arity=(1, 1), float_inputs=(0,)),
    OpDef("GlobalMaxPool", infer_global, global_reference, arity=(1, 1), float_inputs=(0,)),
    OpDef("AdaptiveAvgPool", infer_adaptive, adaptive_reference, arity=(1, 1), float_inputs=(0,)),
    OpDef("AdaptiveMaxPool", infer_adaptive, adaptive_reference, arity=(1, 1), float_inputs=(0,)),
)
