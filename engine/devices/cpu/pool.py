"""CPU kernels of the pooling ops (engine/ops/pool.py): numba loops over N*C planes, AvgPool on oneDNN's NCHW
pooling where it is exact and has a jit kernel (else the separable numba loop), MaxPool of wide windows on oneDNN's
blocked pooling between reorders (onednn/pool.py, VIA_BLOCKED_MIN_TAPS), numba row sums for GlobalAvgPool;
other dtypes than float32 run the reference (marked a fallback). Each kernel names its path (`impl`, shown by the
per-op profile)."""

from __future__ import annotations

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu.kernel import Backends, CpuKernel, reference_fallback, remember
from engine.devices.cpu.loops import pool as PK
from engine.devices.cpu.loops import rows as PL
from engine.devices.cpu.onednn import pool as onednn_pool
from engine.devices.cpu.onednn.blocked import native_block
from engine.devices.cpu.threads import parallel_for
from engine.ir import Node
from engine.ops.pool import adaptive_reference, avgpool_reference, global_reference, maxpool_reference, pool_geom
from engine.ops.registry import TensorInfo

# The max pool's passes are vectorised compares streaming their rows: the loop splits over the threads at this many
# times threads.MIN_WORK of them. In-process A/B, 2 vCPUs, AVX-512 EPYC, ms one / two threads: 2x2 s2 128 @56 0.062
# / 0.116, 256 @28 0.059 / 0.101, 32 @160 0.093 / 0.118, 3x3 s2 64 @56 0.152 / 0.174; 3x3 s2 64 @112 0.346 / 0.277.
MAXPOOL_TAPS_PER_WORK = 5


def _is_f32(ins: list[TensorInfo]) -> bool:
    return np.dtype(ins[0].dtype) == np.float32


def _maxpool_via_blocked(backends: Backends, node: Node, ins: list[TensorInfo]) -> int:
    """The nChw{B}c block a float32 MaxPool runs in between reorders (onednn_pool.via_blocked_pays), else 0."""
    if not (backends.onednn and _is_f32(ins) and len(ins[0].shape) == 4):
        return 0
    block = native_block()
    return block if onednn_pool.via_blocked_pays(node, pool_geom(node, ins[0].shape), block) else 0


def _maxpool_workspace(backends: Backends, node: Node, ins: list[TensorInfo]) -> int:
    block = _maxpool_via_blocked(backends, node, ins)
    return onednn_pool.via_blocked_bytes(pool_geom(node, ins[0].shape), block) if block else 0


def build_maxpool(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
    if not _is_f32(ins):
        return reference_fallback(node, maxpool_reference)

    geoms: dict[tuple[int, ...], tuple] = {}  # per input shape: (planes, work, kernel args); no per-call geometry

    def run(inputs, outputs, workspace):
        x = np.ascontiguousarray(inputs[0])
        args = geoms.get(x.shape)
        if args is None:
            g = pool_geom(node, x.shape)
            # the separable kernel does ~kh + kw passes per output row of width w (not kh*kw taps per output),
            # each a vectorised compare (MAXPOOL_TAPS_PER_WORK)
            work = g.n * g.c * g.oh * (g.w * g.kernel[0] + g.ow * g.kernel[1]) // MAXPOOL_TAPS_PER_WORK
            args = remember(geoms, x.shape, (g.n * g.c, work, (*g.kernel, *g.stride, *g.dilation, *g.pads[:2])))
        parallel_for(PK.max_pool, args[0], args[1], x, outputs[0], *args[2])
    run.impl = "numba:max_pool"  # type: ignore[attr-defined]
    run.shapes = geoms  # type: ignore[attr-defined]
    block = _maxpool_via_blocked(backends, node, ins)
    if block:
        return onednn_pool.build_via_blocked(node, ins, pool_geom, block, run)
    return run


def build_avgpool(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
    if not _is_f32(ins):
        return reference_fallback(node, avgpool_reference)
    include = bool(node.params.get("count_include_pad", True))
    divisor = int(node.params.get("divisor_override") or 0)

    geoms: dict[tuple[int, ...], tuple] = {}  # per input shape: (planes, work, kernel args, divisors)

    def run(inputs, outputs, workspace):
        x = np.ascontiguousarray(inputs[0])
        args = geoms.get(x.shape)
        if args is None:
            g = pool_geom(node, x.shape)
            d = PK.avg_divisors(g.h, g.w, g.oh, g.ow, *g.kernel, *g.stride, *g.pads, include, divisor)
            work = g.n * g.c * g.oh * (g.w * g.kernel[0] + g.ow * g.kernel[1])
            args = remember(geoms, x.shape, (g.n * g.c, work, (*g.kernel, *g.stride, *g.pads[:2], d)))
        parallel_for(PK.avg_pool, args[0], args[1], x, outputs[0], *args[2])
    run.impl = "numba:avg_pool"  # type: ignore[attr-defined]
    run.shapes = geoms  # type: ignore[attr-defined]
    # oneDNN's NCHW average pooling where it has a jit kernel for it (AVX-512 hosts): 2x2 s2 64ch@56 0.18 vs
    # 0.79 ms b1 against the numba loop before it was separable (MaxPool measured no faster there: stays)
    if backends.onednn and onednn_pool.supported(node, ins, pool_geom):
        return onednn_pool.build(node, ins, pool_geom, run)
    return run


def build_global(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
    dtype = np.dtype(ins[0].dtype)
    if node.op_type == "GlobalMaxPool":
        return _global_max(node, dtype)
    if dtype not in (np.float32, np.float64):
        return reference_fallback(node, global_reference)
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
    run.impl = "numba:row_sums"  # type: ignore[attr-defined]
    return run


def _global_max(node: Node, dtype: np.dtype) -> Kernel:
    """GlobalMaxPool: float32 maps through the int-ordered row max (loops/pool.py global_max), split over planes;
    other dtypes and empty maps numpy's max (the reference's error for an empty one)."""
    if dtype != np.float32:
        def run_numpy(inputs, outputs, workspace):
            x = inputs[0]
            np.max(x.reshape(x.shape[0], x.shape[1], -1), axis=2, out=outputs[0].reshape(x.shape[0], x.shape[1]))
        run_numpy.impl = "numpy:max"  # type: ignore[attr-defined]
        return run_numpy
    PK.global_max(np.zeros((0, 1), np.int32), np.zeros(0, np.float32), 0, 0)  # compile at build

    def run(inputs, outputs, workspace):
        x = np.ascontiguousarray(inputs[0])
        planes = x.shape[0] * x.shape[1]
        hw = x.size // max(planes, 1)
        if hw == 0:
            np.copyto(outputs[0], global_reference(node, [x])[0])
            return
        parallel_for(PK.global_max, planes, x.size // 4, x.reshape(planes, hw).view(np.int32),
                     outputs[0].reshape(planes))
    run.impl = "numba:global_max"  # type: ignore[attr-defined]
    return run


def build_adaptive(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
    if not _is_f32(ins):
        return reference_fallback(node, adaptive_reference)
    is_max = node.op_type == "AdaptiveMaxPool"

    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        parallel_for(PK.adaptive_pool, x.shape[0] * x.shape[1], x.size, x, out, is_max)
    run.impl = "numba:adaptive_pool"  # type: ignore[attr-defined]
    return run


KERNELS = {
    "MaxPool": CpuKernel(build_maxpool, _maxpool_workspace),
    "AvgPool": CpuKernel(build_avgpool),
    "GlobalAvgPool": CpuKernel(build_global),
    "GlobalMaxPool": CpuKernel(build_global),
    "AdaptiveAvgPool": CpuKernel(build_adaptive),
    "AdaptiveMaxPool": CpuKernel(build_adaptive),
}
