"""pnnx activations and softmax -> Relu, Sigmoid, Tanh, Silu, Mish, Clip (ReLU6, Hardtanh), LeakyRelu, Elu, Gelu,
HardSwish, HardSigmoid, Softplus, PRelu, Softmax and LogSoftmax."""

from __future__ import annotations

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.registry import handles
from engine.formats.pnnx.lowering.torch_params import const_input

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
    slope = const_input(ctx, "weight", 1) if ctx.type == "F.prelu" else ctx.weight("weight")
    ctx.become("PRelu", {}, {"slope": slope.reshape(-1)}, inputs=[ctx.x()])


@handles("nn.Softmax", "F.softmax", "torch.softmax", "nn.LogSoftmax", "F.log_softmax", "torch.log_softmax")
def softmax(ctx: Ctx) -> None:
    if not ctx.has("dim"):
        raise ctx.unsupported("no dim (torch's implicit-dim softmax)")
    op = "LogSoftmax" if "log" in ctx.type.lower() else "Softmax"
    ctx.become(op, {"axis": int(ctx.p("dim"))}, inputs=[ctx.x()])
