"""TNN's int8 layers that only move bytes, as TNN's x86 accs move them: QuantizedPermute and QuantizedReshape /
QuantizedReshapeTensorflow (both LAYER_RESHAPE) -> Transpose / Reshape chains on int8 data.

TNN's x86 device has its own accs for both (picked by layer type whatever the data type: X86Device::CreateLayerAcc,
source/tnn/device/x86/x86_device.cc), and its int8 blobs are 4-D NHWC4 (X86LayerAcc::SupportDataFormat,
source/tnn/device/x86/acc/x86_layer_acc.cc: channels padded to a multiple of 4, X86Device::Calculate1DMemorySize;
other ranks have no data format and fail at init). Neither acc knows that layout:
- X86PermuteLayerAcc (source/tnn/device/x86/acc/x86_permute_layer_acc.cc, X86Permute<int8_t>) permutes the
  buffer as if it held the NCHW tensor of the blob's dims;
- X86ReshapeLayerAcc (source/tnn/device/x86/acc/x86_reshape_layer_acc.cc) memcpy's the first N*C*H*W bytes for
  reshape_type 0, and for reshape_type 1 (the Tensorflow order) converts the data as 4-byte floats
  (ConvertFromNCHWToNHWC<float>) whatever the blob's type, past the int8 buffer's end: refused.
With channels a multiple of 4 on both blobs the NHWC4 buffer is the NHWC order with no padding, so the results
are: permute = NHWC bytes read as NCHW, transposed, written as NCHW and read back as NHWC; reshape = the NHWC
bytes read back as NHWC of the new dims. With other channel counts the accs read the padding bytes (whatever the
producer left there) or leave real bytes unwritten: refused. Neither rescales, so the output bytes are read
with the output blob's scale, as the lowering driver does for every int8 layer.
"""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import Ctx
from engine.formats.tnn.lowering.layout import tnn_permutation
from engine.formats.tnn.lowering.registry import handles_quantized
from engine.ir import Value

NHWC4 = 4  # x86 int8 blobs pad channels to this multiple


def _nhwc4_dims(c: Ctx, role: str, dims) -> list[int]:
    dims = [int(d) for d in dims]
    if len(dims) != 4:
        c.unsupported(f"int8 with a {len(dims)}-D {role} blob (TNN's x86 int8 blobs are 4-D NHWC4 only)")
    if dims[1] % NHWC4:
        c.unsupported(f"int8 with {dims[1]} {role} channels, not a multiple of {NHWC4} (TNN's x86 acc moves "
                      "the NHWC4 buffer as plain NCHW bytes, so it reads or leaves its padding bytes)")
    return dims


def _to_bytes(c: Ctx, x: Value, dims: list[int]) -> Value:
    """The int8 buffer (NHWC, no padding) viewed as the NCHW tensor of `dims`, as TNN's x86 acc indexes it."""
    nhwc = c.tmp("Transpose", [x], {"perm": [0, 2, 3, 1]})
    return c.tmp("Reshape", [nhwc], {"shape": dims})


def _from_bytes(c: Ctx, y: Value, dims: list[int]) -> None:
    """The NCHW-written buffer of `dims` read back as the NHWC4 (= NHWC) int8 blob of those dims."""
    n, ch, h, w = dims
    nhwc = c.tmp("Reshape", [y], {"shape": [n, h, w, ch]})
    c.out("Transpose", [nhwc], {"perm": [0, 3, 1, 2]})


@handles_quantized("QuantizedPermute")
def lower_qpermute(c: Ctx) -> None:
    if len(c.inputs) != 1:
        c.fail(f"takes one input, has {len(c.inputs)}")
    order, _ = c.counted(0)
    shape = c.shape(c.inputs[0])
    if shape is None:
        c.unsupported("int8 on an input of unknown shape")
    dims = _nhwc4_dims(c, "input", shape)
    perm = tnn_permutation(order, len(dims))
    if sorted(perm) != list(range(len(dims))):
        c.fail(f"orders {order} are not a permutation of {len(dims)} axes")
    out = _nhwc4_dims(c, "output", [dims[k] for k in perm])
    y = c.tmp("Transpose", [_to_bytes(c, c.inputs[0], dims)], {"perm": perm})
    _from_bytes(c, y, out)


def reshaped_dims(c: Ctx, src: list[int], shape: list[int]) -> list[int]:
    """TNN's reshape dims: 0 copies the input's dim, one -1 takes what is left."""
    dims = [src[k] if d == 0 and k < len(src) else int(d) for k, d in enumerate(shape)]
    if dims.count(-1) == 1:
        rest = int(np.prod([d for d in dims if d != -1]))
        dims[dims.index(-1)] = int(np.prod(src)) // rest if rest > 0 else -1
    if any(d <= 0 for d in dims) or int(np.prod(dims)) != int(np.prod(src)):
        c.fail(f"shape {shape} does not reshape {src}")
    return dims


@handles_quantized("QuantizedReshape", "QuantizedReshapeTensorflow")
def lower_qreshape(c: Ctx) -> None:
    if len(c.inputs) != 1:
        # the driver would quantize a shape operand as int8 data: TNN's int8 reshape takes its shape from params
        c.unsupported("int8 with a shape input (the int8 reshape takes its shape from its params)")
    axis, num_axes = c.i(0, 0), c.i(1, -1)
    shape, after = c.counted(2)
    if c.i(after, 0) != 0:
        c.unsupported(f"int8 with reshape_type {c.i(after, 0)} (TNN's x86 acc converts int8 data as 4-byte floats "
                      "for the Tensorflow order)")
    if axis != 0 or num_axes not in (-1, len(shape)):
        c.unsupported(f"of axes {axis}..{axis + num_axes}")
    src = c.shape(c.inputs[0])
    if src is None:
        c.unsupported("int8 on an input of unknown shape")
    dims = _nhwc4_dims(c, "input", src)
    out = _nhwc4_dims(c, "output", reshaped_dims(c, dims, shape))
    nhwc = c.tmp("Transpose", [c.inputs[0]], {"perm": [0, 2, 3, 1]})
    _from_bytes(c, nhwc, out)
