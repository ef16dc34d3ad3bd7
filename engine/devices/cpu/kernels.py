"""The CPU kernel table: op type -> CpuKernel(build, workspace) (see kernel.py), one module per op family.

An op without an entry runs its numpy reference (CpuDevice.build_kernel marks it a fallback): today
Expression (only reaches the runtime when lowering could not turn it into elementwise ops), the alias
ops (Reshape and co.) on the rare occasion their output cannot be a view, and the cheap ops whose vectorised
numpy reference is their kernel for now (one extra copy of the output): GatherElements, RepeatInterleave, Trilu,
TopK, Sort, CumSum, ReduceVar, Range (usually computed at infer time) and DetectionOutput (a sequential NMS over a few
hundred boxes per class). A plugin adds a kernel with
`register_kernel`.
"""

from __future__ import annotations

from engine.devices.cpu import (
    activation,
    attention,
    data_dependent,
    elementwise,
    histogram,
    linear,
    matmul_affine,
    norm,
    packed_attention,
    pad,
    pool,
    quant,
    recurrent,
    reduce,
    resize,
    roi_align,
    scatter,
    shape,
    softmax,
    tensor,
    volume,
)
from engine.devices.cpu.conv import kernels as conv
from engine.devices.cpu.int8 import kernels as int8
from engine.devices.cpu.int8 import upsample as int8_upsample
from engine.devices.cpu.kernel import Builder, CpuKernel, Sizer
from engine.devices.cpu.layout import kernels as layout

KERNELS: dict[str, CpuKernel] = {
    **activation.KERNELS, **attention.KERNELS, **conv.KERNELS, **data_dependent.KERNELS, **elementwise.KERNELS,
    **histogram.KERNELS, **int8.KERNELS, **layout.KERNELS, **linear.KERNELS, **matmul_affine.KERNELS,
    **norm.KERNELS, **packed_attention.KERNELS, **pad.KERNELS, **pool.KERNELS, **quant.KERNELS, **recurrent.KERNELS,
    **reduce.KERNELS, **resize.KERNELS, **roi_align.KERNELS, **scatter.KERNELS, **shape.KERNELS,
    **softmax.KERNELS, **tensor.KERNELS, **volume.KERNELS,
    **int8_upsample.KERNELS,
}


def register_kernel(op_type: str, build: Builder, workspace: Sizer | None = None, replace: bool = False) -> None:
    """Adds the CPU kernel of `op_type` (a plugin's op, registered with engine.ops.register); an op type that has
    one already is an error unless `replace` is set (a plugin that wraps an existing kernel)."""
    if op_type in KERNELS and not replace:
        raise RuntimeError(f"CPU kernel of {op_type!r} registered twice")
    KERNELS[op_type] = CpuKernel(build, workspace)
