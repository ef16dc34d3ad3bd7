"""Pooling (NCHW): MaxPool, AvgPool, GlobalAvgPool, GlobalMaxPool, AdaptiveAvgPool, AdaptiveMaxPool.

Semantics are torch's: ceil_mode drops a last window that would start in the end padding, AvgPool's divisor
counts the window clipped to the pads (count_include_pad) or to the input, adaptive bins are
[floor(i*in/out), ceil((i+1)*in/out)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from engine.devices.cpu.loops import pool as PK
from engine.devices.cpu.loops import rows as PL
from engine.devices.cpu.onednn import pool as _pool_onednn
from engine.devices.cpu.threads import parallel_for
from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import Kernel, OpDef, TensorInfo, register
from engine.ops.spatial import auto_pads, check_rank, out_size, pair

ONEDNN_AVGPOOL = True  # NNSERVE_ONEDNN=0 turns it off with the rest of oneDNN


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


# -- kernels ----------------------------------------------------------------------------------------
def _fallback(node: Node, ref) -> Kernel:
    def run(inputs, outputs, workspace):
        np.copyto(outputs[0], ref(node, list(inputs))[0])
    return run


def _is_f32(ins: list[TensorInfo]) -> bool:
    return np.dtype(ins[0].dtype) == np.float32


def build_maxpool(node: Node, ins: list[TensorInfo]) -> Kernel:
    if not _is_f32(ins):
        return _fallback(node, maxpool_reference)

    geoms: dict[tuple[int, ...], tuple] = {}  # per input shape: (planes, work, kernel args); no per-call geometry

    def run(inputs, outputs, workspace):
        x = np.ascontiguousarray(inputs[0])
        args = geoms.get(x.shape)
        if args is None:
            g = pool_geom(node, x.shape)
            # the separable kernel does ~kh + kw passes per output row of width w (not kh*kw taps per output)
            work = g.n * g.c * g.oh * (g.w * g.kernel[0] + g.ow * g.kernel[1])
            args = geoms[x.shape] = (g.n * g.c, work, (*g.kernel, *g.stride, *g.dilation, g.pads[0], g.pads[1]))
        parallel_for(PK.max_pool, args[0], args[1], x, outputs[0], *args[2])
    return run


def build_avgpool(node: Node, ins: list[TensorInfo]) -> Kernel:
    if not _is_f32(ins):
        return _fallback(node, avgpool_reference)
    include = bool(node.params.get("count_include_pad", True))
    divisor = int(node.params.get("divisor_override") or 0)

    def run(inputs, outputs, workspace):
        x = np.ascontiguousarray(inputs[0])
        g = pool_geom(node, x.shape)
        out = outputs[0]
        parallel_for(PK.avg_pool, g.n * g.c, out.size * g.kernel[0] * g.kernel[1], x, out, *g.kernel, *g.stride,
                     *g.pads, include, divisor)
    # oneDNN's NCHW average pooling: 2x2 s2 64ch@56 0.18 vs 0.79 ms b1 (MaxPool measured no faster there: stays)
    if ONEDNN_AVGPOOL and _pool_onednn.supported(node, ins, pool_geom):
        return _pool_onednn.build(node, ins, pool_geom, run)
    return run


def build_global(node: Node, ins: list[TensorInfo]) -> Kernel:
    if node.op_type == "GlobalMaxPool":
        def run_max(inputs, outputs, workspace):
            x = inputs[0]
            np.max(x.reshape(x.shape[0], x.shape[1], -1), axis=2, out=outputs[0].reshape(x.shape[0], x.shape[1]))
        return run_max
    dtype = np.dtype(ins[0].dtype)
    if dtype not in (np.float32, np.float64):
        return _fallback(node, global_reference)
    PL.row_sums(np.zeros((0, 1), dtype), np.zeros(0, dtype), 1.0, 0, 0)  # compile at build

    def run(inputs, outputs, workspace):
        x = np.ascontiguousarray(inputs[0])
        planes = x.shape[0] * x.shape[1]
        hw = x.size // max(planes, 1)
        if hw == 0:  # empty maps: the reference's NaN means
            np.copyto(outputs[0], global_reference(node, [x])[0])
            return
        # a sum is ~1 op per element: only large maps are worth a pool hop
        parallel_for(PL.row_sums, planes, x.size // 4, x.reshape(planes, hw), outputs[0].reshape(planes),
                     1.0 / hw)
    return run


def build_adaptive(node: Node, ins: list[TensorInfo]) -> Kernel:
    if not _is_f32(ins):
        return _fallback(node, adaptive_reference)
    is_max = node.op_type == "AdaptiveMaxPool"

    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        parallel_for(PK.adaptive_pool, x.shape[0] * x.shape[1], x.size, x, out, is_max)
    return run


register(
    OpDef("MaxPool", infer_pool, maxpool_reference, kernel=build_maxpool),
    OpDef("AvgPool", infer_pool, avgpool_reference, kernel=build_avgpool),
    OpDef("GlobalAvgPool", infer_global, global_reference, kernel=build_global),
    OpDef("GlobalMaxPool", infer_global, global_reference, kernel=build_global),
    OpDef("AdaptiveAvgPool", infer_adaptive, adaptive_reference, kernel=build_adaptive),
    OpDef("AdaptiveMaxPool", infer_adaptive, adaptive_reference, kernel=build_adaptive),
)
