"""TNN `Quantized*` layers -> the int8 ops of engine/ops/quant.py (registered in QUANTIZED).

The lowering driver has already made every input int8 (quantizing float inputs with their blob scales);
these rules fold the blob scales into per-channel factors the way TNN's CPU layer setup does.
"""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import Ctx
from engine.formats.tnn.lowering.registry import handles_quantized, register
from engine.ops.quant import requant_factors

F32 = np.float32


@handles_quantized("QuantizedConvolution")
def lower_qconv(c: Ctx) -> None:
    g, ic, oc, kh, kw = (c.i(k) for k in range(5))
    ph, pw, pad_type, act = c.i(7), c.i(8), c.i(10, -1), c.i(13, 0)
    if pad_type != -1 or act not in (0, 1, 2):
        c.unsupported(f"int8 with pad_type {pad_type} / activation {act}")
    w = c.attr("filter")
    if w.dtype != np.int8 or w.size != oc * ic * kh * kw:
        c.fail(f"int8 filter expected with {oc * ic * kh * kw} values, got {w.dtype} x {w.size}")
    bias = c.attr("bias", required=False)
    bias = np.zeros(oc, np.int32) if bias is None or bias.size == 0 else bias.reshape(oc).astype(np.int32)
    w_scale = np.broadcast_to(np.asarray(c.attr("scale"), F32).reshape(-1), (oc,))
    # The file's scales only (the writer stores the layer again from them); the requantization factors and the
    # ReLU6 ceilings are derived from them where a kernel is built (ops.quant.qconv_factors), not stored twice
    attrs = {"weight": np.ascontiguousarray(w.reshape(oc, ic, kh, kw)), "bias": bias,
             "weight_scale": np.ascontiguousarray(w_scale), "out_scale": c.low.blob_scale(c.outputs[0], c.node)}
    params = {"stride": (c.i(5), c.i(6)), "pads": (ph, pw, ph, pw), "dilation": (c.i(12, 1), c.i(12, 1)),
              "groups": g, "activation": {0: None, 1: "relu", 2: "relu6"}[act]}
    c.out("TnnQConv", [c.inputs[0]], params, attrs)


@handles_quantized("QuantizedInnerProduct")
def lower_qinner_product(c: Ctx) -> None:
    n, transpose, axis = c.i(0), c.i(2, 0), c.i(3, 1)
    if axis != 1:
        c.unsupported(f"int8 on axis {axis}")
    w = c.attr("weight")
    if w.dtype != np.int8 or n <= 0 or w.size % n:
        c.fail(f"int8 weight with a multiple of num_output {n} values expected, got {w.dtype} x {w.size}")
    w = w.reshape(n, -1) if not transpose else w.reshape(-1, n).T
    bias = c.attr("bias", required=False)
    bias = np.zeros(n, np.int32) if bias is None or bias.size == 0 or not c.i(1, 1) else bias.reshape(n)
    w_scale = np.broadcast_to(np.asarray(c.attr("scale"), F32).reshape(-1), (n,))
    attrs = {"weight": np.ascontiguousarray(w), "bias": bias.astype(np.int32), "weight_scale": np.array(w_scale),
             "out_scale": c.low.blob_scale(c.outputs[0], c.node)}
    c.out("TnnQInnerProduct", [c.inputs[0]], {}, attrs)


def _fusable_conv(c: Ctx, v):
    """The 1x1 int8 conv emitted just before this Add, feeding only it: TNN (ARM, naive) fuses the two."""
    conv = v.producer
    if conv is None or conv.op_type != "TnnQConv" or not c.graph.nodes or c.graph.nodes[-1] is not conv:
        return None
    p = conv.params
    plain = conv.attrs["weight"].shape[2:] == (1, 1) and tuple(p["stride"]) == (1, 1) and p["groups"] == 1 \
        and tuple(p["pads"]) == (0, 0, 0, 0) and "fusion" not in p
    return conv if plain and not v.consumers and v not in c.graph.outputs else None


def _fuse_conv_add(c: Ctx, conv, other) -> None:
    out = c.outputs[0]
    conv.attrs["unfused_out_scale"], conv.attrs["out_scale"] = conv.attrs["out_scale"], c.low.blob_scale(out, c.node)
    o_scale = np.broadcast_to(conv.attrs["out_scale"], (conv.attrs["weight"].shape[0],))
    i_scale = np.broadcast_to(c.low.blob_scale(other, c.node), o_scale.shape)
    conv.attrs["add_scale"] = requant_factors(i_scale, o_scale)[0]
    conv.params["fusion"] = "add_then_act" if conv.params["activation"] is None else "act_then_add"
    conv.inputs.append(other)
    other.consumers.append(conv)
    conv.outputs[0].producer = None
    conv.outputs = [out]
    out.producer = conv
    c.low.track(conv)


@handles_quantized("QuantizedAdd")
def lower_qadd(c: Ctx) -> None:
    if len(c.inputs) != 2:
        c.unsupported("int8 with a stored constant")
    a, b = c.inputs
    for mine, other in ((a, b), (b, a)):
        conv = _fusable_conv(c, mine)
        if conv is not None:
            return _fuse_conv_add(c, conv, other)
    out_scale = c.low.blob_scale(c.outputs[0], c.node)
    attrs = {"scale_a": c.low.blob_scale(a, c.node), "scale_b": c.low.blob_scale(b, c.node),
             "scale_out": out_scale, "out_scale": out_scale}
    c.out("TnnQAdd", [a, b], {}, attrs)


@handles_quantized("QuantizedPooling")
def lower_qpool(c: Ctx) -> None:
    ptype, kh, kw, sh, sw, ph, pw = (c.i(k) for k in range(7))
    if c.i(9, -1) != -1 or c.i(11, 0) or ptype not in (0, 1):
        c.unsupported("int8 with pad_type, adaptive size or pool type other than explicit max/avg")
    params = {"mode": "max" if ptype == 0 else "avg", "kernel": (kh, kw), "stride": (sh, sw), "pads": (ph, pw),
              "ceil_mode": bool(c.i(10, 0))}
    c.out("TnnQPool", [c.inputs[0]], params, {"out_scale": c.low.blob_scale(c.outputs[0], c.node)})


@handles_quantized("QuantizedConcat")
def lower_qconcat(c: Ctx) -> None:
    scales = [c.low.blob_scale(v, c.node) for v in [*c.inputs, c.outputs[0]]]
    attrs = {"out_scale": scales[-1]}
    if all(s.size == 1 for s in scales):
        attrs.update({"scales": np.concatenate(scales[:-1]).astype(F32), "scale_out": scales[-1]})
    c.out("TnnQConcat", list(c.inputs), {"axis": c.i(0, 1)}, attrs)


register({"QuantizedReLU": lambda c: c.out("TnnQRelu", [c.inputs[0]], {},
                                          {"out_scale": c.low.blob_scale(c.outputs[0], c.node)})},
         quantized=True)
