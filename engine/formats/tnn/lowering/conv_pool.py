"""TNN Convolution, Deconvolution and Pooling layers -> Conv / ConvTranspose / MaxPool / AvgPool / Global*Pool /
AdaptiveAvgPool; Convolution1D and Pooling1D as the 2-D ops on an (N, C, 1, L) view (parameter orders:
../shared/docs)."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import Ctx, f32
from engine.formats.tnn.lowering.registry import handles
from engine.ir import Value

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
    w = c.weight("filter")
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


def _unit_dim(c: Ctx) -> Value:
    """(N, C, L) -> (N, C, 1, L): the 1-D layers run as 2-D ops on a 1-row view, as pnnx's Conv1d does."""
    shape = c.shape(c.inputs[0])
    if shape is not None and len(shape) != 3:
        c.fail(f"takes an (N, C, L) input, got {len(shape)}-D {shape}")
    return c.tmp("Unsqueeze", [c.inputs[0]], {"axes": [2]})


def _back_to_3d(c: Ctx, op: str, x4: Value, params: dict | None = None, attrs: dict | None = None) -> None:
    y4 = c.tmp(op, [x4], params, attrs)
    c.out("Squeeze", [y4], {"axes": [2]})


@handles("Convolution1D")
def lower_conv1d(c: Ctx) -> None:
    """Params `group in out kernel stride pad_right pad_left bias pad_type dilation act` (Conv1DLayerInterpreter
    reads the pads as (pad_h, pad_w) and keeps them as pads = [pad_w, pad_h]: the window starts pads[0] = the 7th
    param before the input, NaiveConv1D)."""
    g, oc, k, stride = c.i(0), c.i(2), c.i(3), c.i(4)
    right, left, has_bias, pad_type, dil, act = c.i(5), c.i(6), c.i(7), c.i(8, -1), c.i(9, 1), c.i(10, 0)
    if act not in ACTIVATIONS:
        c.unsupported(f"with fused activation type {act}")
    if min(g, oc, k, stride, dil) <= 0 or min(left, right) < 0:
        c.fail(f"group={g} out={oc} kernel={k} stride={stride} dilation={dil} pads=({left}, {right})")
    params = {"stride": (1, stride), "dilation": (1, dil), "groups": g, "pads": (0, left, 0, right),
              "activation": ACTIVATIONS[act]}
    # TNN sizes SAME / VALID from the undilated kernel and truncates a negative pad_along / 2 toward zero: the
    # ONNX rules agree only for dilation 1 (and, for VALID, a stride of at most 2, where that pad stays 0).
    if pad_type == 0 and dil == 1:
        params["auto_pad"] = "same_upper"
    elif pad_type == 1 and dil == 1 and stride <= 2:
        params["auto_pad"] = "valid"
    elif pad_type != -1:
        c.unsupported(f"with pad_type {pad_type}, dilation {dil} and stride {stride}")
    w = c.weight("filter")
    if w.size == 0 or w.size % (oc * k):
        c.fail(f"filter has {w.size} values, not a multiple of out * kernel = {oc * k}")
    attrs = {"weight": f32(w.reshape(oc, w.size // (oc * k), 1, k))}
    bias = c.attr("bias", required=False)
    if has_bias and bias is not None and bias.size:
        if bias.size != oc:
            c.fail(f"bias has {bias.size} values, out={oc}")
        attrs["bias"] = f32(bias.reshape(oc))
    _back_to_3d(c, "Conv", _unit_dim(c), params, attrs)


@handles("Pooling1D")
def lower_pooling1d(c: Ctx) -> None:
    """Params `pool_type kernel stride pad kernel_index_w kernel_index_h pad_type ceil_mode` (Pooling1DLayer:
    a kernel of 0 is the whole length; a kernel index takes the kernel from an input dim)."""
    ptype, k, stride, pad = c.i(0), c.i(1), c.i(2), c.i(3)
    kidx, pad_type, ceil = (c.i(4, -1), c.i(5, -1)), c.i(6, -1), c.i(7, 0)
    if ptype not in (0, 1):
        c.unsupported(f"pool_type {ptype}")
    if kidx != (-1, -1):
        c.unsupported("with the kernel size taken from an input dim")
    if stride <= 0 or k < 0 or pad < 0:
        c.fail(f"kernel={k} stride={stride} pad={pad}")
    op = ("MaxPool", "AvgPool")[ptype]
    if k == 0:
        if pad or pad_type != -1:
            c.unsupported("over the whole length with padding")
        return _back_to_3d(c, "GlobalMaxPool" if ptype == 0 else "GlobalAvgPool", _unit_dim(c))
    # TNN averages over the window clipped to the input, never over padding (NaivePooling).
    params = {"kernel": (1, k), "stride": (1, stride), "pads": (0, pad, 0, pad), "ceil_mode": bool(ceil),
              "count_include_pad": False}
    if pad_type == 1:
        # VALID: out = ceil((L - k + 1) / stride), pad_top = ceil(pad_along / stride) = 0
        params.update(pads=(0, 0, 0, 0), ceil_mode=False)
    elif pad_type == 0 and stride == 1:
        # SAME: out = L, pad_top = ceil(pad_along / stride) = k - 1 before and none after (not ONNX's split)
        params.update(pads=(0, k - 1, 0, 0), ceil_mode=False)
    elif pad_type != -1:
        c.unsupported(f"with pad_type {pad_type} and stride {stride} (TNN's SAME puts ceil(pad / stride) first)")
    shape = c.shape(c.inputs[0])
    if pad_type == -1 and ceil and shape is not None and len(shape) == 3:
        # TNN keeps a last window that starts in the end padding (it reads no element there); torch's ceil_mode,
        # the pool ops', drops it: one output element fewer
        out = -(-(shape[2] + 2 * pad - k) // stride) + 1
        if (out - 1) * stride >= shape[2] + pad:
            c.unsupported(f"with ceil_mode where the last window starts in the padding (length {shape[2]})")
    _back_to_3d(c, op, _unit_dim(c), params)
