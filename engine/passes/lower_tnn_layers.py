"""Per-layer TNN -> canonical op rules used by `engine.passes.lower_tnn` (parameter orders: ../shared/docs)."""

from __future__ import annotations

import numpy as np

from engine.passes.lower_tnn import Ctx, Handler
from engine.passes.lower_tnn_quant import QUANTIZED
from engine.passes.lower_tnn_shape import SHAPE_HANDLERS
from engine.passes.lower_tnn_ssd import SSD_HANDLERS

F32 = np.float32
ACTIVATIONS = {0: None, 1: "relu", 2: "relu6", 256: "silu"}


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=F32)


# -- convolution ------------------------------------------------------------------------------------------------
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


def lower_conv(c: Ctx) -> None:
    g, ic, oc, kh, kw = (c.i(k) for k in range(5))
    params = conv_params(c)
    attrs = {"weight": _f32(conv_weight(c, (oc, ic, kh, kw)))}
    bias = c.attr("bias", required=False)
    if c.i(9, 0) and bias is not None and bias.size:
        attrs["bias"] = _f32(bias.reshape(oc))
    c.out("Conv", [c.inputs[0]], params, attrs)


def lower_deconv(c: Ctx) -> None:
    g, ic, oc, kh, kw = (c.i(k) for k in range(5))
    params = conv_params(c)
    if "auto_pad" in params:
        c.unsupported(f"with pad_type {c.i(10)}")
    params["output_padding"] = (0, 0)
    attrs = {"weight": _f32(conv_weight(c, (ic * g, oc // max(g, 1), kh, kw)))}
    bias = c.attr("bias", required=False)
    if c.i(9, 0) and bias is not None and bias.size:
        attrs["bias"] = _f32(bias.reshape(oc))
    c.out("ConvTranspose", [c.inputs[0]], params, attrs)


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


# -- normalization and activations ---------------------------------------------------------------------------------
def _per_channel(c: Ctx, a: np.ndarray | None, fill: float) -> np.ndarray:
    channels = c.shape(c.inputs[0])
    n = channels[1] if channels and len(channels) > 1 else (a.size if a is not None and a.size else 1)
    if a is None or a.size == 0:
        return np.full(n, fill, F32)
    return _f32(np.broadcast_to(a.reshape(-1), (n,)) if a.size == 1 else a.reshape(-1))


def lower_batchnorm(c: Ctx) -> None:
    """BatchNormCxx and Scale: y = scale * x + bias per channel (BN arrives folded)."""
    scale = _per_channel(c, c.attr("scale"), 1.0)
    bias = _per_channel(c, c.attr("bias", required=False), 0.0)
    c.out("BatchNorm", [c.inputs[0]], {}, {"scale": scale, "bias": _f32(np.broadcast_to(bias, scale.shape))})


def lower_instnorm(c: Ctx) -> None:
    attrs = {"weight": _per_channel(c, c.attr("scale", required=False), 1.0),
             "bias": _per_channel(c, c.attr("bias", required=False), 0.0)}
    c.out("InstanceNorm", [c.inputs[0]], {"eps": c.f(1, 1e-5)}, attrs)


def _const_input(c: Ctx, k: int) -> np.ndarray | None:
    if k >= len(c.inputs):
        return None
    data = c.value_of(c.inputs[k])
    if data is None:
        c.unsupported(f"with a non-constant input {k}")
    return _f32(data)


def lower_layernorm(c: Ctx) -> None:
    attrs = {k: v for k, v in (("weight", _const_input(c, 1)), ("bias", _const_input(c, 2))) if v is not None}
    c.out("LayerNorm", [c.inputs[0]], {"normalized_ndim": c.i(0), "eps": c.f(1, 1e-5)}, attrs)


def lower_groupnorm(c: Ctx) -> None:
    attrs = {k: v for k, v in (("weight", _const_input(c, 1)), ("bias", _const_input(c, 2))) if v is not None}
    c.out("GroupNorm", [c.inputs[0]], {"num_groups": c.i(0), "eps": c.f(1, 1e-5)}, attrs)


def lower_normalize(c: Ctx) -> None:
    # TNN's CPU kernel: x / max(||x||_2, eps) or x / ||x||_1 over channels (axis 1) only
    if c.i(0, 0) or c.i(2, 0) or c.i(3, 1) != 1 or c.i(4, 2) not in (1, 2):
        c.unsupported("across spatial dims, with a shared channel, another axis or a p other than 1 or 2")
    c.out("LpNormalize", [c.inputs[0]], {"eps": c.f(1, 1e-12), "axis": c.i(3, 1), "p": c.i(4, 2)})


def lower_prelu(c: Ctx) -> None:
    slope = c.attr("slope")
    if c.i(0, 0) or slope.size == 1:
        return c.out("LeakyRelu", [c.inputs[0]], {"alpha": float(slope.reshape(-1)[0])})
    c.out("PRelu", [c.inputs[0]], {}, {"slope": _f32(slope.reshape(-1))})


def lower_clip(c: Ctx) -> None:
    lo, hi = c.f(0, -np.inf), c.f(1, np.inf)
    # TNN writes unbounded sides as +-DBL_MAX
    c.out("Clip", [c.inputs[0]], {"min": None if lo < -3e38 else lo, "max": None if hi > 3e38 else hi})


def lower_hardswish(c: Ctx) -> None:
    alpha, beta = c.f(0, 1 / 6), c.f(1, 0.5)
    if len(c.inputs) == 1:
        return c.out("HardSwish", [c.inputs[0]], {"alpha": alpha, "beta": beta})
    # two inputs: y = x0 * hardsigmoid(x1)
    gate = c.tmp("HardSigmoid", [c.inputs[1]], {"alpha": alpha, "beta": beta})
    c.out("Mul", [c.inputs[0], gate])


def _unary(op: str, **params) -> Handler:
    return lambda c: c.out(op, [c.inputs[0]], dict(params))


def _with_floats(op: str, *names_defaults) -> Handler:
    def run(c: Ctx) -> None:
        c.out(op, [c.inputs[0]], {n: c.f(k, d) for k, (n, d) in enumerate(names_defaults)})
    return run


def lower_power(c: Ctx) -> None:
    exponent, scale, shift = c.f(0, 1.0), c.f(1, 1.0), c.f(2, 0.0)
    x = c.inputs[0]
    if scale != 1.0:
        x = c.tmp("Mul", [x, c.const(F32(scale), "scale")])
    if shift != 0.0:
        x = c.tmp("Add", [x, c.const(F32(shift), "shift")])
    c.out("Pow", [x, c.const(F32(exponent), "exponent")])


def lower_lstm(c: Ctx) -> None:
    clip, hidden, direction = c.f(0, 0.0), c.i(1), c.i(2, 0)
    if clip or direction not in (0, 1, 2) or not 4 <= len(c.inputs) <= 6:
        c.unsupported("with a clip threshold, an unknown direction or missing weights")
    c.emit("TnnLSTM", list(c.inputs), {"hidden_size": hidden, "direction": direction}, outputs=list(c.outputs))


HANDLERS: dict[str, Handler] = {
    "Convolution": lower_conv, "Deconvolution": lower_deconv, "Pooling": lower_pooling,
    "BatchNormCxx": lower_batchnorm, "BatchNormalization": lower_batchnorm, "Scale": lower_batchnorm,
    "InstBatchNormCxx": lower_instnorm, "LayerNorm": lower_layernorm, "GroupNorm": lower_groupnorm,
    "Normalize": lower_normalize, "PReLU": lower_prelu, "Clip": lower_clip, "HardSwish": lower_hardswish,
    "ReLU": _unary("Relu"), "Relu": _unary("Relu"), "ReLU6": _unary("Clip", min=0.0, max=6.0),
    "Relu6": _unary("Clip", min=0.0, max=6.0), "Sigmoid": _unary("Sigmoid"), "Tanh": _unary("Tanh"),
    "Swish": _unary("Silu"), "GELU": _unary("Gelu"), "Softplus": _unary("Softplus"),
    "HardSigmoid": _with_floats("HardSigmoid", ("alpha", 0.2), ("beta", 0.5)),
    "Elu": _with_floats("Elu", ("alpha", 1.0)), "Power": lower_power,
    "LeakyRelu": _with_floats("LeakyRelu", ("alpha", 0.01)),  # no param written: ONNX's default slope
    "Abs": _unary("Abs"), "Exp": _unary("Exp"), "Log": _unary("Log"), "Neg": _unary("Neg"),
    "Sqrt": _unary("Sqrt"), "Rsqrt": _unary("Rsqrt"), "Square": _unary("Square"), "Floor": _unary("Floor"),
    "Ceil": _unary("Ceil"), "Sign": _unary("Sign"), "Reciprocal": _unary("Reciprocal"), "Erf": _unary("Erf"),
    "Sin": _unary("Sin"), "Cos": _unary("Cos"), "Tan": _unary("Tan"), "Asin": _unary("Asin"),
    "Acos": _unary("Acos"), "Atan": _unary("Atan"), "Not": _unary("Not"),
    "Dropout": _unary("Identity"), "Identity": _unary("Identity"), "LSTMONNX": lower_lstm,
    **SHAPE_HANDLERS, **SSD_HANDLERS,
}
__all__ = ["HANDLERS", "QUANTIZED"]
