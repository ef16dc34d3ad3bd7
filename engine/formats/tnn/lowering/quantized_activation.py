"""TNN's QuantizedSigmoid: refused at load.

TNN's x86 device registers its own acc for LAYER_SIGMOID (X86SigmoidLayerAcc,
source/tnn/device/x86/acc/x86_sigmoid_layer_acc.cc), and x86 picks accs by layer type whatever the blobs' data
type (X86Device::CreateLayerAcc, source/tnn/device/x86/x86_device.cc; the naive CpuUnaryLayerAcc is only its
fallback for types it does not register). That acc is X86Unary2LayerAcc::DoForward
(source/tnn/device/x86/acc/x86_unary2_layer_acc.cc), which reads the input and writes the output as float32
whatever their type: on int8 blobs (NHWC4, one byte per value) it reads four times the blob's bytes and writes
float bit patterns into int8 storage. There is no int8 result to follow, so the layer is refused.
"""

from __future__ import annotations

from engine.formats.tnn.lowering.context import Ctx
from engine.formats.tnn.lowering.registry import handles_quantized


@handles_quantized("QuantizedSigmoid")
def lower_qsigmoid(c: Ctx) -> None:
    c.unsupported("int8: TNN's x86 acc for Sigmoid (X86Unary2LayerAcc::DoForward, "
                  "source/tnn/device/x86/acc/x86_unary2_layer_acc.cc) reads and writes its int8 blobs as float32, "
                  "so TNN defines no int8 result")
