"""TNN's int8 layers that only move bytes -> the layout ops on int8 data: QuantizedPermute -> Transpose,
QuantizedReshape / QuantizedReshapeTensorflow (both TNN's LAYER_RESHAPE) -> Reshape.

TNN runs them with its naive CPU accs (x86 falls back to them for int8): CpuPermuteLayerAcc permutes the int8
elements (NaivePermute<int8_t>) and CpuReshapeLayerAcc memcpy's them; neither rescales, so the output bytes are
the input's, read with the output blob's scale. That is what the int8 ops here do: the lowering driver reads the
result with the output blob scale as it does for every int8 layer. CpuReshapeLayerAcc's reshape_type 1 (the
Tensorflow NHWC order) converts the data as 4-byte floats (ConvertFromNCHWToNHWC<float>) whatever the blob's
type, so on int8 data it moves groups of four bytes past the tensor's end: refused.
"""

from __future__ import annotations

from engine.formats.tnn.lowering.context import Ctx
from engine.formats.tnn.lowering.layout import lower_permute, lower_reshape
from engine.formats.tnn.lowering.registry import handles_quantized


@handles_quantized("QuantizedPermute")
def lower_qpermute(c: Ctx) -> None:
    if len(c.inputs) != 1:
        c.fail(f"takes one input, has {len(c.inputs)}")
    lower_permute(c)


@handles_quantized("QuantizedReshape", "QuantizedReshapeTensorflow")
def lower_qreshape(c: Ctx) -> None:
    if len(c.inputs) != 1:
        # the driver would quantize a shape operand as int8 data: TNN's int8 reshape takes its shape from params
        c.unsupported("int8 with a shape input (the int8 reshape takes its shape from its params)")
    _, after = c.counted(2)
    if c.i(after, 0) != 0:
        c.unsupported(f"int8 with reshape_type {c.i(after, 0)} (TNN's CPU acc converts int8 data as 4-byte floats "
                      "for the Tensorflow order)")
    lower_reshape(c)
