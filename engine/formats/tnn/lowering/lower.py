"""lower_tnn: replaces every TNN layer (`tnn:Convolution`, ...) by the canonical ops of engine/ops/SPEC.md (and the
TNN int8 ops of engine/ops/quant.py), through the handler each layer family module registers. Each layer becomes
one or more canonical nodes whose last node takes over the layer's output values, so consumers stay linked.
"""

from __future__ import annotations

import numpy as np

from engine.errors import EngineError, UnsupportedOpError
from engine.formats.tnn.constants import TYPE_ALIASES
from engine.formats.tnn.lowering import (  # noqa: F401  (each registers its handlers)
    binary,
    conv_pool,
    data_dependent,
    dynamic_range,
    hdr_guide,
    histogram,
    indexing,
    layout,
    linear,
    normalization,
    pad_resize,
    quantized,
    quantized_layout,
    quantized_upsample,
    recurrent,
    reduce,
    roi,
    ssd,
    tensor,
    unary,
    volume,
)
from engine.formats.tnn.lowering.context import PREFIX, Ctx
from engine.formats.tnn.lowering.registry import HANDLERS, QUANTIZED, register
from engine.formats.tnn.lowering.state import LoweringState
from engine.ir import Graph, Node

# TNN reads an alias exactly as the type it stands for (constants.TYPE_ALIASES)
register({alias: HANDLERS[base] for alias, base in TYPE_ALIASES.items() if base in HANDLERS})
register({alias: QUANTIZED[base] for alias, base in TYPE_ALIASES.items() if base in QUANTIZED}, quantized=True)

# Types refused on purpose, with the reason the error gives.
REFUSED: dict[str, str] = {
    "Deconvolution3D": "(onnx2tnn writes it, but TNN's layer type map has no Deconvolution3D: TNN cannot load it)",
    "Reformat": "(a data type / layout conversion TNN's runtime inserts between devices, not a model layer)",
    # x86 picks accs by layer type whatever the blobs' data type (X86Device::CreateLayerAcc, x86_device.cc), and its
    # Sigmoid acc reads the input and writes the output as float32 whatever their type: on NHWC4 int8 blobs it
    # reads four times the blob's bytes and writes float bit patterns into int8 storage.
    "QuantizedSigmoid": "(int8: TNN's x86 acc for Sigmoid (X86Unary2LayerAcc::DoForward, "
                        "source/tnn/device/x86/acc/x86_unary2_layer_acc.cc) reads and writes its int8 blobs as "
                        "float32, so TNN defines no int8 result)",
}

# The TNN layer types lower_tnn handles, float and quantized.
HANDLED_TYPES: frozenset[str] = frozenset(HANDLERS) | frozenset(QUANTIZED)


def lower_tnn(graph: Graph) -> Graph:
    """Replaces every `tnn:*` node by canonical (and TNN int8) ops; raises UnsupportedOpError naming the layer."""
    low = LoweringState(graph)
    old, graph.nodes = graph.nodes, []
    for node in old:
        if not node.op_type.startswith(PREFIX):  # already canonical (lowering twice is harmless)
            graph.nodes.append(node)
            low.track(node)
            continue
        _lower(low, node)
    _dequantize_outputs(low)
    graph.remove_dead()
    return graph


def _lower(low: LoweringState, node: Node) -> None:
    for v in node.inputs:
        while node in v.consumers:
            v.consumers.remove(node)
    for v in node.outputs:
        v.producer = None
    ctx = Ctx(low, node)
    try:
        _dispatch(low, ctx, node)
    except EngineError:
        raise
    except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError) as e:
        # parameters that parse but make no sense (a weight of the wrong size, an axis out of range)
        ctx.fail(f"inconsistent parameters or weights: {type(e).__name__}: {e}")


def _dispatch(low: LoweringState, ctx: Ctx, node: Node) -> None:
    ltype = ctx.type
    if ltype in QUANTIZED:
        node.inputs = [low.as_int8(v, node) for v in node.inputs]
        QUANTIZED[ltype](ctx)
        for v in node.outputs:
            low.int8.add(v)
            v.dtype = np.dtype(np.int8)
        return
    handler = HANDLERS.get(ltype)
    if handler is None:
        reason = REFUSED.get(ltype)
        raise UnsupportedOpError(node.op_type + (f" {reason}" if reason else ""), node.name, node.where())
    node.inputs = [low.as_float(v, node) for v in node.inputs]
    handler(ctx)


def _dequantize_outputs(low: LoweringState) -> None:
    graph = low.graph
    for k, v in enumerate(graph.outputs):
        if v in low.int8:
            name = v.name
            v.name = f"{name}__int8"
            deq = low.as_float(v, graph.nodes[-1])
            deq.name = name
            graph.outputs[k] = deq
