"""Writer rules for TNN's int8 ops (engine/ops/quant.py): they become `Quantized*` layers again.

TNN keeps one blob per tensor and its scale in a `<blob>_scale_data_` BlobScale resource; the int8 and float
versions of a tensor (our TnnQuantize / TnnDequantize pairs) are the same blob there. So quantize and
dequantize nodes write no layer: their two sides share a name and the scale is recorded for the blob.
A 1x1 conv fused with the Add it fed is written as the two layers it came from (the reader fuses them again).
As TNN's quantization tool (ModelPacker) does, a layer's resource header names its float type (`Convolution`,
`InnerProduct`); the proto line says `Quantized...`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.formats.tnn.writer.core import Writer
from engine.formats.tnn.writer.registry import register
from engine.ir import Node

F32 = np.float32
ACT_CODES = {None: 0, "relu": 1, "relu6": 2}


def link_int8_names(w: Writer) -> None:
    """Before writing: an int8 value dequantized into a graph output takes that output's name."""
    for node in w.graph.nodes:
        if node.op_type == "TnnDequantize" and node.outputs[0] in w.graph.outputs:
            w._names[id(node.inputs[0])] = w.name(node.outputs[0])


def _scale(w: Writer, blob: str, scale: np.ndarray) -> None:
    w.blob_scales[blob] = np.asarray(scale, F32).reshape(-1)


def quantize(w: Writer, node: Node) -> None:
    src, dst = node.inputs[0], node.outputs[0]
    if node.op_type == "TnnDequantize" and dst in w.graph.outputs:
        return _scale(w, w.name(src), node.attrs["scale"])
    if id(dst) not in w._names:
        w.alias(dst, src)
    _scale(w, w.name(src), node.attrs["scale"])


def qconv(w: Writer, node: Node) -> None:
    p, weight = node.params, node.attrs["weight"]
    oc, icg, kh, kw = weight.shape
    (sh, sw), (dh, _), pads = p["stride"], p["dilation"], p["pads"]
    out, fusion = w.name(node.outputs[0]), p.get("fusion")
    conv_out = w.tmp("conv") if fusion else out
    params = [p["groups"], icg, oc, kh, kw, sh, sw, pads[0], pads[1], 1, -1, dh, dh, ACT_CODES[p["activation"]]]
    res = [("name",), ("int", 1), w.raw(weight, False), w.raw(node.attrs["bias"], False),
           w.raw(np.asarray(node.attrs["weight_scale"], F32), False)]
    _resource_type(w, w.layer("QuantizedConvolution", [w.name(node.inputs[0])], [conv_out], params, res),
                   "Convolution")
    if fusion:
        _scale(w, conv_out, node.attrs["unfused_out_scale"])
        w.layer("QuantizedAdd", [conv_out, w.name(node.inputs[1])], [out], [-1], name=f"{node.name}/add")
    _scale(w, out, node.attrs["out_scale"])


def qinner_product(w: Writer, node: Node) -> None:
    weight = node.attrs["weight"]
    out = w.name(node.outputs[0])
    res = [("name",), w.raw(weight, False), w.raw(node.attrs["bias"], False),
           w.raw(np.asarray(node.attrs["weight_scale"], F32), False)]
    _resource_type(w, w.layer("QuantizedInnerProduct", [w.name(node.inputs[0])], [out], [weight.shape[0], 1, 0, 1],
                              res), "InnerProduct")
    _scale(w, out, node.attrs["out_scale"])


def _resource_type(w: Writer, layer: str, float_type: str) -> None:
    ltype, name, items = w.resources[-1]
    assert name == layer, (name, layer)
    w.resources[-1] = (float_type, name, items)


def _simple(ltype: str, params: Callable[[Node], list]) -> Callable[[Writer, Node], None]:
    def run(w: Writer, node: Node) -> None:
        out = w.name(node.outputs[0])
        w.layer(ltype, [w.name(v) for v in node.inputs], [out], params(node))
        _scale(w, out, node.attrs["out_scale"])
    return run


def _pool_params(node: Node) -> list:
    p = node.params
    kh, kw = p["kernel"]
    (sh, sw), (ph, pw) = p["stride"], p["pads"]
    return [0 if p["mode"] == "max" else 1, kh, kw, sh, sw, ph, pw, -1, -1, -1, int(bool(p.get("ceil_mode")))]


def _upsample_params(node: Node) -> list:
    """UpsampleLayerInterpreter's order: mode, scale_h, scale_w, align_corners, then the size (h, w) when one was
    given; align_corners as resolved at load (never -1, which TNN would choose again)."""
    p = node.params
    mode, align = {"nearest": 1, "bilinear": 2}[p["mode"]], int(bool(p.get("align_corners")))
    if p.get("size") is not None:
        return [mode, 0.0, 0.0, align, *(int(v) for v in p["size"])]
    return [mode, *(float(F32(v)) for v in p["scale"]), align]


register({
    "TnnQuantize": quantize, "TnnDequantize": quantize, "TnnQConv": qconv, "TnnQInnerProduct": qinner_product,
    "TnnQAdd": _simple("QuantizedAdd", lambda n: [-1]),
    "TnnQPool": _simple("QuantizedPooling", _pool_params),
    "TnnQConcat": _simple("QuantizedConcat", lambda n: [int(n.params.get("axis", 1))]),
    "TnnQRelu": _simple("QuantizedReLU", lambda n: []),
    "TnnQUpsample": _simple("QuantizedUpsample", _upsample_params),
})
