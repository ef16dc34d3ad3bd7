"""TNN Convolution, Deconvolution and Pooling layers -> Conv / ConvTranspose / MaxPool / AvgPool / Global*Pool /
AdaptiveAvgPool (parameter orders: ../shared/docs)."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import Ctx, f32
from engine.formats.tnn.lowering.registry import handles

ACTIVATIONS = {0: None, 1: "relu", 2: "relu6", 256: "silu"}


def conv_params(c: Ctx) -> dict:
    """The Conv/ConvTranspose params of a `group in out kh kw sh sw ph pw bias pad_type dh dw act` list."""
    pad_type, act = c.i(10, -1), c.i(13, 0)
    if act not in ACTIVATIONS:
        c.unsupported(f"with fused activation type {act}")
    ph, pw = c.i(7), c.i(8)
    p = {"stride": (c.i(5), c.i(6)), "dilation": (c.i(11, 1), c.i(12, 1)), "groups": c.i(0),
         "pads": (ph, pw, ph, pw), "activation": ACTIVATIONS[act]}
    if pad_type in (0, 1):
        p["auto_pad"] = "same_upper" if pad_type == 0 else "valid"
    elif pad_type != -1:
        c.unsupported(f"with pad_type {pad_type}")
    return p


def conv_weight(c: Ctx, shape: tuple[int, ...]) -> np.ndarray:
    w = c.attr("filter")
    if w.size != int(np.prod(shape)):
        c.fail(f"filter has {w.size} values, the parameters need {shape}")
    return w.reshape(shape)


@handles("Convolution")
def lower_conv(c: Ctx) -> None:
    g, ic, oc, kh, kw = (c.i(k) for k in range(5))
    params = conv_params(c)
    attrs = {"weight": f32(conv_weight(c, (oc, ic, kh, kw)))}
    bias = c.attr("bias", required=False)
    if c.i(9, 0) and bias is not None and bias.size:
        attrs["bias"] = f32(bias.reshape(oc))
    c.out("Conv", [c.inputs[0]], params, attrs)


@handles("Deconvolution")
def lower_deconv(c: Ctx) -> None:
    g, ic, oc, kh, kw = (c.i(k) for k in range(5))
    params = conv_params(c)
    if "auto_pad" in params:
        c.unsupported(f"with pad_type {c.i(10)}")
    params["output_padding"] = (0, 0)
    attrs = {"weight": f32(conv_weight(c, (ic * g, oc // max(g, 1), kh, kw)))}
    bias = c.attr("bias", required=False)
    if c.i(9, 0) and bias is not None and bias.size:
        attrs["bias"] = f32(bias.reshape(oc))
    c.out("ConvTranspose", [c.inputs[0]], params, attrs)


@handles("Pooling")
def lower_pooling(c: Ctx) -> None:
    ptype, kh, kw, sh, sw, ph, pw = (c.i(k) for k in range(7))
    kidx, pad_type, ceil, adaptive = (c.i(7, -1), c.i(8, -1)), c.i(9, -1), c.i(10, 0), c.i(11, 0)
    if adaptive:
        size = (c.i(12, -1), c.i(13, -1))
        if min(size) <= 0:
            c.unsupported("adaptive without an output size")
        # TNN's adaptive pooling always averages
        return c.out("AdaptiveAvgPool", [c.inputs[0]], {"output_size": size})
    if kidx != (-1, -1):
        c.unsupported("with kernel sizes taken from input dims")
    op = ("MaxPool", "AvgPool")[ptype] if ptype in (0, 1) else c.unsupported(f"pool_type {ptype}")
    if kh == 0 and kw == 0:
        return c.out("GlobalMaxPool" if ptype == 0 else "GlobalAvgPool", [c.inputs[0]])
    # TNN averages over the window clipped to the input, never over padding.
    params = {"kernel": (kh, kw), "stride": (sh, sw), "pads": (ph, pw, ph, pw), "ceil_mode": bool(ceil),
              "count_include_pad": False}
    if pad_type in (0, 1):
        params["auto_pad"] = "same_upper" if pad_type == 0 else "valid"
    c.out(op, [c.inputs[0]], params)
