"""The CPU's Conv, ConvTranspose and ConvBlocked kernels: which path a convolution takes.

Float32 convolutions run on oneDNN (onednn.py, transposed.py) when it is on and has an optimized kernel for them,
except plain 1x1 convs, which run as oneDNN matmuls (pointwise.py; one GEMM on the direct path without oneDNN),
and long 1-D convs (im2col + GEMM there); the rest take the direct paths (direct.py), never oneDNN's reference
implementation (scalar loops, see onednn.is_reference).
A plain dense 3x3 stride-1 conv that Winograd F(4x4) pays for runs it between two reorders (winograd_nchw.py)
instead of oneDNN's direct kernel.
Other dtypes run the float64 reference, with the epilogue applied as the CPU applies it. ConvBlocked is
blocked.py's.
"""

from __future__ import annotations

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu.conv import blocked, direct, onednn, pointwise, transposed, winograd_nchw
from engine.devices.cpu.epilogue import apply_activation
from engine.devices.cpu.kernel import Backends, CpuKernel
from engine.devices.cpu.onednn.blocked import native_block
from engine.ir import Node
from engine.ops.conv import conv_sums, tconv_sums
from engine.ops.conv_geometry import ConvGeom, conv_geom
from engine.ops.registry import TensorInfo

# A dense 1-D conv (a 2-D one over one row: Conv1d as pnnx lowers it) whose output has at least this many
# elements per image runs as im2col + GEMM: oneDNN computes it in a blocked layout, reorders the large output back
# to NCW and splits one output row poorly over the threads, where the GEMM writes NCW and splits well (one-layer
# graphs, 2 threads, AVX2 EPYC, wall ms oneDNN / direct: 80->384 k3 @1500 3.3-3.4 / 2.5-2.6, @3000 8.2 / 5.5,
# @6000 11.4-14.6 / 9.5-10.5, 128->256 k3 @4000 9.1-11.2 / 7.4-7.7; ties at 384->384 k3 s2 @3000 and 512->512 k3
# s2 @3199, 256->256 k5 @2000; oneDNN ahead below it: 64->64 k5 d4 @1024 0.62 / 0.71, 512->512 k2 s2 @49 0.40 / 0.76).
CONV1D_DIRECT_OUTPUTS = 1 << 18
# A stride-1 depthwise conv whose channels do not fill whole blocks and whose output map has at least this many
# pixels runs the direct loop (loops.depthwise) on NCHW: oneDNN's reorders of a partial last block take its
# generic kernel (jit:uni, 3-5x the whole-block one's time). In-process A/B, 2 vCPUs, AVX-512 EPYC, ms oneDNN /
# direct: 3x3 20 @56 0.146 / 0.123, 24 @56 0.136 / 0.080, 72 @56 0.305 / 0.182, 8 @320 0.94 / 0.42, 100 @28
# 0.120 / 0.102, 5x5 20 @56 0.158 / 0.111; oneDNN ahead at whole blocks (32 @112 0.14 / 0.21), on smaller maps
# (200 @14 0.059 / 0.091) and at stride 2 (72 @56 0.130 / 0.169).
DEPTHWISE_DIRECT_PIXELS = 28 * 28


def _use_onednn(backends: Backends, node: Node, ins: list[TensorInfo]) -> bool:
    """oneDNN for every supported conv but plain 1x1s, stems (direct.is_stem) and long 1-D convs: on NCHW the first
    two are one GEMM here, which beat oneDNN's blocked kernel plus its two reorders (24->144 @56 relu6: 0.60 vs
    0.94 ms b1) and its NCHW GEMM with an eltwise post-op (10 ms) in 7 of 10 MobileNet-V2 layer shapes at 2
    threads; the last see CONV1D_DIRECT_OUTPUTS. Depthwise and grouped convs oneDNN has no jit kernel for take
    the direct ones (direct.OVER_ONEDNN_GEMM), as do stride-1 depthwise ones with a partial last block over large
    maps (DEPTHWISE_DIRECT_PIXELS)."""
    if not (backends.onednn and onednn.supported(node, ins)):
        return False
    geo = conv_geom(node, ins[0].shape)
    if geo.groups == 1 and direct.kind(geo) == "gemm" or direct.kind(geo) == "im2col" and direct.is_stem(geo):
        return False
    if _long_conv1d(geo):
        return False
    if _partial_block_depthwise(geo):
        return False
    impl = onednn.primitive_impl(onednn.ConvSpec(node, len(ins) > 1), tuple(ins[0].shape))
    if direct.kind(geo) in direct.OVER_ONEDNN_GEMM and not onednn.is_jit(impl):
        return False
    return not onednn.is_reference(impl)


def _pointwise(backends: Backends, node: Node, ins: list[TensorInfo]) -> bool:
    """A plain 1x1 conv on oneDNN's matmul (pointwise.py) rather than the direct path's GEMM."""
    return backends.onednn and onednn.supported(node, ins) and pointwise.applies(node, ins)


def _partial_block_depthwise(geo: ConvGeom) -> bool:
    """A stride-1 depthwise conv over a map of DEPTHWISE_DIRECT_PIXELS or more whose channels leave the last block
    partial: the direct loop's."""
    block = native_block()
    return (direct.kind(geo) == "depthwise" and geo.stride == (1, 1) and block > 0 and geo.c % block != 0
            and geo.oh * geo.ow >= DEPTHWISE_DIRECT_PIXELS)


def _long_conv1d(geo: ConvGeom) -> bool:
    """A dense conv over one row with a large output (CONV1D_DIRECT_OUTPUTS), on the direct im2col path."""
    return (geo.groups == 1 and geo.h == geo.kh == geo.oh == 1 and direct.kind(geo) == "im2col"
            and geo.o * geo.ow >= CONV1D_DIRECT_OUTPUTS)


def _use_onednn_tconv(backends: Backends, node: Node, ins: list[TensorInfo]) -> bool:
    return backends.onednn and transposed.supported(node, ins) and _optimized(transposed.DeconvSpec(node), ins)


def _optimized(spec: onednn.ConvSpec, ins: list[TensorInfo]) -> bool:
    """Whether oneDNN has more than its reference implementation for this conv at the max shape."""
    return not onednn.is_reference(onednn.primitive_impl(spec, tuple(ins[0].shape)))


def _fallback(node: Node, sums) -> Kernel:
    """Non-float32 inputs: the reference's float64 sums, the activation, then the output dtype (the fast kernels are
    float32 only)."""
    act, params = node.params.get("activation"), node.params.get("activation_params")

    def run(inputs, outputs, workspace):
        acc = sums(node, list(inputs))
        apply_activation(act, params, acc)
        np.copyto(outputs[0], acc.astype(inputs[0].dtype))
    run.is_fallback = True  # type: ignore[attr-defined]  # the reference's sums (allocating), listed as such
    run.impl = "reference"  # type: ignore[attr-defined]
    return run


def build_conv(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
    if np.dtype(ins[0].dtype) != np.float32:
        return _fallback(node, conv_sums)
    if _use_onednn(backends, node, ins):
        if winograd_nchw.applies(backends, node, ins):
            return winograd_nchw.build(backends, node, ins)
        return onednn.build(onednn.ConvSpec(node, len(ins) > 1), ins)
    if _pointwise(backends, node, ins):
        return pointwise.build(node, ins)
    return direct.build_conv(backends.blas, node, ins)


def conv_workspace(backends: Backends, node: Node, ins: list[TensorInfo]) -> int:
    if _use_onednn(backends, node, ins):
        if winograd_nchw.applies(backends, node, ins):
            return winograd_nchw.workspace(backends, node, ins)
        return onednn.workspace(onednn.ConvSpec(node, len(ins) > 1), ins)
    if _pointwise(backends, node, ins):
        return pointwise.workspace(node, ins)
    return direct.conv_workspace(node, ins)


def build_tconv(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
    if np.dtype(ins[0].dtype) != np.float32:
        return _fallback(node, tconv_sums)
    if _use_onednn_tconv(backends, node, ins):
        return transposed.build_tconv(node, ins)
    return direct.build_tconv(backends.blas, node, ins)


def tconv_workspace(backends: Backends, node: Node, ins: list[TensorInfo]) -> int:
    if _use_onednn_tconv(backends, node, ins):
        return transposed.tconv_workspace(node, ins)
    return direct.tconv_workspace(node, ins)


KERNELS = {
    "Conv": CpuKernel(build_conv, conv_workspace),
    "ConvTranspose": CpuKernel(build_tconv, tconv_workspace),
    "ConvBlocked": CpuKernel(blocked.build, blocked.workspace),
}
