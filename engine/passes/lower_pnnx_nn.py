"""pnnx layers with weights or spatial params -> canonical ops: conv, linear, norms, activations, pooling,
resize, pad, embedding, shuffles, softmax. Param names on the pnnx side are torch's (pnnx-format.md §7)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from engine.passes.lower_pnnx import handles

if TYPE_CHECKING:
    from engine.passes.lower_pnnx import Ctx


def _pair(v, default: int = 0) -> list[int]:
    if v is None or v == []:
        return [default, default]
    if isinstance(v, (int, float)):
        return [int(v), int(v)]
    v = [int(x) for x in v]
    return v * 2 if len(v) == 1 else v[-2:]


def _pads(padding) -> list[int]:
    ph, pw = _pair(padding)
    return [ph, pw, ph, pw]


def _same_pads(kernel: list[int], dilation: list[int]) -> list[int]:
    # torch pads d*(k-1) in total, the odd extra element at the end (bottom / right)
    total = [d * (k - 1) for k, d in zip(kernel, dilation, strict=True)]
    return [total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2]


# -- convolution and linear ----------------------------------------------------------------------------------
def _conv_params(ctx: Ctx, kernel: list[int]) -> dict:
    dilation = _pair(ctx.p("dilation"), 1)
    padding = ctx.p("padding", 0)
    if padding == "same":
        pads = _same_pads(kernel, dilation)
    elif padding == "valid":
        pads = [0, 0, 0, 0]
    else:
        pads = _pads(padding)
    mode = ctx.p("padding_mode", "zeros")
    if mode not in ("zeros", "reflect", "replicate", "circular"):
        raise ctx.fail(f"unknown padding_mode {mode!r}")
    return {"stride": _pair(ctx.p("stride"), 1), "pads": pads, "dilation": dilation,
            "groups": int(ctx.p("groups", 1)), "pad_mode": mode, "auto_pad": None,
            "activation": None, "activation_params": {}}


def _const_input(ctx: Ctx, name: str, position: int | None):
    """A weight passed as an input (F.conv2d, F.linear, ...): only constant ones can be lowered."""
    v = ctx.arg(name, position)
    if v is None:
        return None
    if not v.is_const:
        raise ctx.unsupported(f"a run-time {name} input")
    return np.asarray(v.const, np.float32)


@handles("nn.Conv2d", "F.conv2d")
def conv2d(ctx: Ctx) -> None:
    if ctx.type == "F.conv2d":
        w, b = _const_input(ctx, "weight", 1), _const_input(ctx, "bias", 2)
    else:
        w, b = ctx.weight("weight"), ctx.weight("bias", required=False)
    if w is None or w.ndim != 4:
        raise ctx.fail("needs a 4-D weight")
    attrs = {"weight": w} if b is None else {"weight": w, "bias": b}
    ctx.become("Conv", _conv_params(ctx, list(w.shape[2:])), attrs, inputs=[ctx.x()])


@handles("nn.Conv1d")
def conv1d(ctx: Ctx) -> None:
    # (N, C, L) -> (N, C, 1, L): a 1-D conv is a 2-D conv with a 1-row kernel.
    w, b = ctx.weight("weight"), ctx.weight("bias", required=False)
    one = {k: [1, int(ctx.p(k, [d])[0])] for k, d in (("stride", 1), ("dilation", 1))}
    padding = ctx.p("padding", [0])
    k = int(w.shape[2])
    if padding == "same":
        total = one["dilation"][1] * (k - 1)
        pads = [0, total // 2, 0, total - total // 2]
    else:
        pads = [0, 0, 0, 0] if padding == "valid" else [0, int(padding[0]), 0, int(padding[0])]
    params = {**one, "pads": pads, "groups": int(ctx.p("groups", 1)), "pad_mode": ctx.p("padding_mode", "zeros"),
              "auto_pad": None, "activation": None, "activation_params": {}}
    attrs = {"weight": w.reshape(w.shape[0], w.shape[1], 1, k)} | ({} if b is None else {"bias": b})
    (x4,) = ctx.emit("Unsqueeze", [ctx.x()], {"axes": [2]})
    (y4,) = ctx.emit("Conv", [x4], params, attrs)
    ctx.emit("Squeeze", [y4], {"axes": [2]}, outputs=[ctx.node.outputs[0]])
    ctx.done()


@handles("nn.ConvTranspose2d")
def conv_transpose2d(ctx: Ctx) -> None:
    w, b = ctx.weight("weight"), ctx.weight("bias", required=False)
    params = {"stride": _pair(ctx.p("stride"), 1), "pads": _pads(ctx.p("padding", 0)),
              "output_padding": _pair(ctx.p("output_padding"), 0), "dilation": _pair(ctx.p("dilation"), 1),
              "groups": int(ctx.p("groups", 1)), "activation": None, "activation_params": {}}
    ctx.become("ConvTranspose", params, {"weight": w} | ({} if b is None else {"bias": b}), inputs=[ctx.x()])


@handles("nn.Linear", "F.linear")
def linear(ctx: Ctx) -> None:
    if ctx.type == "F.linear":
        w, b = _const_input(ctx, "weight", 1), _const_input(ctx, "bias", 2)
    else:
        w, b = ctx.weight("weight"), ctx.weight("bias", required=False)
    attrs = {"weight": w} | ({} if b is None else {"bias": b})
    ctx.become("Gemm", {"activation": None, "activation_params": {}}, attrs, inputs=[ctx.x()])


@handles("nn.Embedding")
def embedding(ctx: Ctx) -> None:
    table = ctx.const(ctx.weight("weight"), name=f"{ctx.node.name}.weight")
    ctx.become("Gather", {"axis": 0}, inputs=[table, ctx.x()])


# -- normalization -------------------------------------------------------------------------------------------
def _folded_bn(ctx: Ctx, mean, var, gamma, beta, eps: float) -> dict:
    # y = (x - mean) / sqrt(var + eps) * gamma + beta, folded in float64 once
    scale = np.asarray(gamma, np.float64) / np.sqrt(np.asarray(var, np.float64) + eps)
    bias = np.asarray(beta, np.float64) - np.asarray(mean, np.float64) * scale
    return {"scale": scale.astype(np.float32), "bias": bias.astype(np.float32)}


@handles("nn.BatchNorm1d", "nn.BatchNorm2d", "nn.BatchNorm3d")
def batch_norm(ctx: Ctx) -> None:
    mean, var = ctx.weight("running_mean"), ctx.weight("running_var")
    gamma = ctx.weight("weight", required=False)
    beta = ctx.weight("bias", required=False)
    gamma = np.ones_like(mean) if gamma is None else gamma
    beta = np.zeros_like(mean) if beta is None else beta
    ctx.become("BatchNorm", {}, _folded_bn(ctx, mean, var, gamma, beta, float(ctx.p("eps", 1e-5))),
               inputs=[ctx.x()])


def _affine(ctx: Ctx) -> dict:
    """weight / bias as attrs: module attributes, or constant inputs of the functional form (F.layer_norm)."""
    attrs = {}
    for name in ("weight", "bias"):
        if ctx.type.startswith("F."):
            w = _const_input(ctx, name, None)  # only a `$weight` / `$bias` input; `weight=None` is a param
        else:
            w = ctx.weight(name, required=False)
        if w is not None:
            attrs[name] = w
    return attrs


@handles("nn.LayerNorm", "F.layer_norm")
def layer_norm(ctx: Ctx) -> None:
    shape = ctx.p("normalized_shape", [])
    ndim = 1 if isinstance(shape, int) else len(shape)
    ctx.become("LayerNorm", {"normalized_ndim": ndim, "eps": float(ctx.p("eps", 1e-5))}, _affine(ctx),
               inputs=[ctx.x()])


@handles("nn.GroupNorm", "F.group_norm")
def group_norm(ctx: Ctx) -> None:
    ctx.become("GroupNorm", {"num_groups": int(ctx.p("num_groups")), "eps": float(ctx.p("eps", 1e-5))},
               _affine(ctx), inputs=[ctx.x()])


@handles("nn.InstanceNorm1d", "nn.InstanceNorm2d", "nn.InstanceNorm3d", "F.instance_norm")
def instance_norm(ctx: Ctx) -> None:
    eps = float(ctx.p("eps", 1e-5))
    if ctx.arg("running_mean") is not None and not ctx.p("use_input_stats", True):
        raise ctx.unsupported("running statistics")
    if ctx.p("track_running_stats", False) and "running_mean" in ctx.node.attrs:
        # eval mode with running statistics: a per-channel affine map, like BatchNorm
        mean, var = ctx.weight("running_mean"), ctx.weight("running_var")
        aff = _affine(ctx)
        attrs = _folded_bn(ctx, mean, var, aff.get("weight", np.ones_like(mean)),
                           aff.get("bias", np.zeros_like(mean)), eps)
        ctx.become("BatchNorm", {}, attrs, inputs=[ctx.x()])
        return
    ctx.become("InstanceNorm", {"eps": eps}, _affine(ctx), inputs=[ctx.x()])


# -- activations and softmax -----------------------------------------------------------------------------
_SIMPLE = {"nn.ReLU": "Relu", "F.relu": "Relu", "torch.relu": "Relu", "nn.Sigmoid": "Sigmoid",
           "F.sigmoid": "Sigmoid", "torch.sigmoid": "Sigmoid", "nn.Tanh": "Tanh", "F.tanh": "Tanh",
           "torch.tanh": "Tanh", "nn.SiLU": "Silu", "F.silu": "Silu", "nn.Mish": "Mish", "F.mish": "Mish"}


@handles(*_SIMPLE)
def simple_activation(ctx: Ctx) -> None:
    ctx.become(_SIMPLE[ctx.type], {}, inputs=[ctx.x()])


@handles("nn.ReLU6", "F.relu6")
def relu6(ctx: Ctx) -> None:
    ctx.become("Clip", {"min": 0.0, "max": 6.0}, inputs=[ctx.x()])


@handles("nn.Hardtanh", "F.hardtanh")
def hardtanh(ctx: Ctx) -> None:
    ctx.become("Clip", {"min": float(ctx.p("min_val", -1.0)), "max": float(ctx.p("max_val", 1.0))},
               inputs=[ctx.x()])


@handles("nn.LeakyReLU", "F.leaky_relu")
def leaky_relu(ctx: Ctx) -> None:
    ctx.become("LeakyRelu", {"alpha": float(ctx.p("negative_slope", 0.01))}, inputs=[ctx.x()])


@handles("nn.ELU", "F.elu")
def elu(ctx: Ctx) -> None:
    ctx.become("Elu", {"alpha": float(ctx.p("alpha", 1.0))}, inputs=[ctx.x()])


@handles("nn.GELU", "F.gelu")
def gelu(ctx: Ctx) -> None:
    approximate = "tanh" if ctx.p("approximate", "none") == "tanh" else "none"
    ctx.become("Gelu", {"approximate": approximate}, inputs=[ctx.x()])


@handles("nn.Hardswish", "F.hardswish")
def hardswish(ctx: Ctx) -> None:
    ctx.become("HardSwish", {"alpha": 1 / 6, "beta": 0.5}, inputs=[ctx.x()])


@handles("nn.Hardsigmoid", "F.hardsigmoid")
def hardsigmoid(ctx: Ctx) -> None:
    ctx.become("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, inputs=[ctx.x()])


@handles("nn.Softplus", "F.softplus")
def softplus(ctx: Ctx) -> None:
    ctx.become("Softplus", {"beta": float(ctx.p("beta", 1.0)), "threshold": float(ctx.p("threshold", 20.0))},
               inputs=[ctx.x()])


@handles("nn.PReLU", "F.prelu")
def prelu(ctx: Ctx) -> None:
    slope = _const_input(ctx, "weight", 1) if ctx.type == "F.prelu" else ctx.weight("weight")
    ctx.become("PRelu", {}, {"slope": slope.reshape(-1)}, inputs=[ctx.x()])


@handles("nn.Softmax", "F.softmax", "torch.softmax", "nn.LogSoftmax", "F.log_softmax", "torch.log_softmax")
def softmax(ctx: Ctx) -> None:
    if not ctx.has("dim"):
        raise ctx.unsupported("no dim (torch's implicit-dim softmax)")
    op = "LogSoftmax" if "log" in ctx.type.lower() else "Softmax"
    ctx.become(op, {"axis": int(ctx.p("dim"))}, inputs=[ctx.x()])


# -- pooling -----------------------------------------------------------------------------------------------
@handles("nn.MaxPool2d", "F.max_pool2d", "nn.AvgPool2d", "F.avg_pool2d")
def pool2d(ctx: Ctx) -> None:
    ctx.drop_outputs(1, "the pooling indices output")  # written return_indices=True even when unused
    kernel = _pair(ctx.p("kernel_size"))
    stride = ctx.p("stride")
    params = {"kernel": kernel, "stride": kernel if stride in (None, []) else _pair(stride, 1),
              "pads": _pads(ctx.p("padding", 0)), "ceil_mode": bool(ctx.p("ceil_mode", False)), "auto_pad": None}
    if "max" in ctx.type.lower():
        ctx.become("MaxPool", params | {"dilation": _pair(ctx.p("dilation"), 1)}, inputs=[ctx.x()])
    else:
        override = ctx.p("divisor_override")
        params |= {"count_include_pad": bool(ctx.p("count_include_pad", True)),
                   "divisor_override": None if override is None else int(override)}
        ctx.become("AvgPool", params, inputs=[ctx.x()])


@handles("nn.AdaptiveAvgPool2d", "F.adaptive_avg_pool2d", "nn.AdaptiveMaxPool2d", "F.adaptive_max_pool2d")
def adaptive_pool2d(ctx: Ctx) -> None:
    ctx.drop_outputs(1, "the pooling indices output")
    size = ctx.node.params.get("output_size")
    size = [size, size] if isinstance(size, int) or size is None else list(size)
    kind = "Max" if "max" in ctx.type.lower() else "Avg"
    if size == [1, 1]:
        ctx.become(f"Global{kind}Pool", {}, inputs=[ctx.x()])
    else:
        ctx.become(f"Adaptive{kind}Pool", {"output_size": size}, inputs=[ctx.x()])


# -- resize, pad, shuffles -----------------------------------------------------------------------------------
_RESIZE_MODES = {"nearest": "nearest", "nearest-exact": "nearest_exact", "bilinear": "bilinear", "bicubic": "bicubic"}


@handles("nn.Upsample", "F.upsample", "F.interpolate", "F.upsample_nearest", "F.upsample_bilinear",
         "nn.UpsamplingNearest2d", "nn.UpsamplingBilinear2d")
def resize(ctx: Ctx) -> None:
    default_mode = "bilinear" if "ilinear" in ctx.type else "nearest"
    mode = ctx.p("mode", default_mode)
    if mode not in _RESIZE_MODES:
        raise ctx.unsupported(f"mode={mode}")
    # upsample_bilinear / UpsamplingBilinear2d always align corners
    align = bool(ctx.p("align_corners", "ilinear" in ctx.type)) and not mode.startswith("nearest")
    size, scale = ctx.p("size"), ctx.p("scale_factor")
    params = {"mode": _RESIZE_MODES[mode], "align_corners": align, "coordinate": "torch",
              "size": None if size is None else _pair(size), "scale": None}
    if scale is not None:
        scale = [float(scale)] * 2 if isinstance(scale, (int, float)) else [float(s) for s in scale]
        params["scale"] = scale * 2 if len(scale) == 1 else scale[-2:]
    inputs = [ctx.arg("input", 0) or ctx.x()]
    dyn = ctx.arg("size") or ctx.arg("scale_factor")
    if dyn is not None:
        if ctx.arg("scale_factor") is not None:
            raise ctx.unsupported("a run-time scale_factor")
        inputs.append(dyn)
        params["size"] = None
    elif params["size"] is None and params["scale"] is None:
        raise ctx.fail("has neither size nor scale_factor")
    elif params["scale"] is not None and ctx.p("recompute_scale_factor", False):
        # torch: out = floor(in * scale), then sample as if that size had been asked for
        sh, sw = params["scale"]
        expr = f"[int(floor(mul(size(@0,2),{sh!r}))),int(floor(mul(size(@0,3),{sw!r})))]"
        inputs += ctx.emit("Expression", [inputs[0]], {"expr": expr})
        params["scale"] = None
    ctx.become("Resize", params, inputs=inputs)


@handles("F.pad", "nn.ZeroPad2d", "nn.ConstantPad2d", "nn.ReflectionPad2d", "nn.ReplicationPad2d")
def pad(ctx: Ctx) -> None:
    modes = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "circular"}
    module_modes = {"nn.ReflectionPad2d": "reflect", "nn.ReplicationPad2d": "replicate"}
    mode = module_modes.get(ctx.type) or ctx.p("mode", "constant")
    if mode not in modes:
        raise ctx.unsupported(f"mode={mode}")
    torch_pad = ctx.p("pad", ctx.p("padding"))
    torch_pad = [int(torch_pad)] * 4 if isinstance(torch_pad, int) else [int(p) for p in torch_pad]
    rank = ctx.rank(ctx.x())
    if len(torch_pad) % 2 or len(torch_pad) // 2 > rank:
        raise ctx.fail(f"pad {torch_pad} does not fit a rank-{rank} input")
    begin, end = [0] * rank, [0] * rank
    for i in range(len(torch_pad) // 2):  # torch lists the last dim first
        begin[rank - 1 - i], end[rank - 1 - i] = torch_pad[2 * i], torch_pad[2 * i + 1]
    value = float(ctx.p("value", 0.0))
    ctx.become("Pad", {"pads": begin + end, "mode": modes[mode], "value": value}, inputs=[ctx.x()])


@handles("nn.PixelShuffle", "F.pixel_shuffle")
def pixel_shuffle(ctx: Ctx) -> None:
    ctx.become("PixelShuffle", {"upscale": int(ctx.p("upscale_factor"))}, inputs=[ctx.x()])


@handles("nn.ChannelShuffle", "F.channel_shuffle", "torch.channel_shuffle")
def channel_shuffle(ctx: Ctx) -> None:
    ctx.become("ChannelShuffle", {"groups": int(ctx.p("groups"))}, inputs=[ctx.x()])
