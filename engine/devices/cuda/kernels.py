"""The CUDA kernel table: op type -> builder(device, node, input infos at max shapes) -> fn(ins, outs, ws).

`wrap` puts every node's constant operands on the device once, at build time; values the runtime computes on
the host (rare: shape arithmetic that feeds data) are uploaded per call. Ops that read a host operand as
parameters (Reshape/Expand shapes, Resize sizes) keep it on the host.

Not here, so a model using them is refused on CUDA with UnsupportedOpError naming the node: `Expression` (only
reaches the runtime when lowering could not turn it into elementwise ops), the TNN int8 ops (`TnnQuantize`,
`TnnDequantize`, `TnnQConv`, `TnnQAdd`, `TnnQConcat`, `TnnQPool`, `TnnQRelu`, `TnnQInnerProduct`,
`TnnQUpsample`), `RNN` (also
TNN's LSTMONNX; a sequential recurrence, it would need its own kernel), the ops added for issue 18 that have no CUDA
kernel yet (`SliceAssign`, `IndexPut`, `Index`, `GatherElements`, `RepeatInterleave`, `Trilu`, `TopK`, `Sort`, `CumSum`,
`ReduceVar`, `DetectionOutput`, `PixelUnshuffle`, `LRN`, `ScatterElements`, `BitShift`, `GridSample`, `Einsum`, the
volumetric `Conv3d` and `Pool3d`, `RoiAlign`,
`Histogram`, and `NonZero` and `NonMaxSuppression`, whose output size depends on the data), `Meshgrid`
when its inputs are not known before running (a YOLO head's grids are: aranges of the input's size), and `Full` and
`Range` when their result is too large to be a host value. `Shape` is always a host value.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from engine.devices.cuda import attention, conv, elementwise, linalg, movement, reduce, spatial
from engine.ir import Node

KERNELS = {
    **elementwise.KERNELS, **movement.KERNELS, **reduce.KERNELS, **conv.KERNELS, **spatial.KERNELS,
    **attention.KERNELS, "Gemm": linalg.build_gemm, "MatMul": linalg.build_matmul,
}
WORKSPACE = dict(conv.WORKSPACE)
HOST_OPERANDS = {"Reshape": {1}, "Expand": {1}, "Resize": {1}}


def wrap(dev, node: Node, run):
    keep = HOST_OPERANDS.get(node.op_type, set())
    consts = {i: dev.upload(v.const) for i, v in enumerate(node.inputs) if v.is_const and i not in keep}
    stream = dev.stream

    def call(inputs, outputs, workspace):
        ins = list(inputs)
        for i, a in enumerate(ins):
            if i in consts:
                ins[i] = consts[i]
            elif isinstance(a, np.ndarray) and i not in keep:
                ins[i] = cuda.to_device(np.ascontiguousarray(a), stream=stream)
        run(ins, outputs, workspace)

    call.cuda_kernel = run  # type: ignore[attr-defined]
    return call
