"""TNN's QuantizedSigmoid -> TnnDequantize, Sigmoid, TnnQuantize.

TNN's naive CPU unary acc (CpuUnaryLayerAcc, int8 branch; x86 falls back to it) computes, per channel c of a
4-D blob, y = float2int8(sigmoid(q * in_scale[c]) / out_scale[c]) in float32: the three ops here, with the two
blob scales. It indexes both scales by channel unless a scale has no values at all (`scale_len == 0 ? s[0] :
s[c]`), so a single per-tensor scale on a blob of more than one channel is read past its end: refused, as are
blobs of rank other than 4 (its strides are dims[1] * dims[2] * dims[3]) and a zero output scale (a division by
zero before the rounding).
"""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import Ctx
from engine.formats.tnn.lowering.registry import handles_quantized


@handles_quantized("QuantizedSigmoid")
def lower_qsigmoid(c: Ctx) -> None:
    if len(c.inputs) != 1:
        c.fail(f"takes one input, has {len(c.inputs)}")
    shape = c.shape(c.inputs[0])
    if shape is None or len(shape) != 4:
        c.unsupported(f"int8 on a {shape} blob (TNN's int8 unary acc walks 4-D NCHW blobs only)")
    scales = {}
    for role, v in (("input", c.inputs[0]), ("output", c.outputs[0])):
        s = c.low.blob_scale(v, c.node)
        if s.size != shape[1] and not (s.size == 1 and shape[1] == 1):
            c.unsupported(f"int8 with {s.size} {role} scale(s) for {shape[1]} channels (TNN's int8 unary acc "
                          "reads one scale per channel)")
        scales[role] = s
    if np.any(scales["output"] == 0):
        c.unsupported("int8 with a zero output scale (TNN divides by it)")
    x = c.tmp("TnnDequantize", [c.inputs[0]], attrs={"scale": scales["input"]})
    y = c.tmp("Sigmoid", [x])
    c.out("TnnQuantize", [y], attrs={"scale": scales["output"]})
