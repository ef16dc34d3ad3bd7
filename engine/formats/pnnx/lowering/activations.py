"""pnnx activations and softmax -> Relu, Sigmoid, Tanh, Silu, Mish, Clip (ReLU6, Hardtanh), LeakyRelu, Elu, Gelu,
HardSwish, HardSigmoid, Softplus, PRelu, Softmax and LogSoftmax; GLU, LogSigmoid, Softsign, SELU and CELU as
the ops of their definitions (so every device that runs those runs them)."""

from __future__ import annotations

import numpy as np

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
    approximate = ctx.p("approximate", "none")  # pnnx writes it only when it is tanh
    if approximate not in ("none", "tanh"):
        raise ctx.unsupported(f"approximate={approximate!r}")
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
    if slope is None:
        raise ctx.fail("has no $weight input")
    ctx.become("PRelu", {}, {"slope": slope.reshape(-1)}, inputs=[ctx.x()])


@handles("nn.Softmax", "F.softmax", "torch.softmax", "nn.LogSoftmax", "F.log_softmax", "torch.log_softmax",
         "nn.Softmin", "F.softmin", "nn.Softmax2d")
def softmax(ctx: Ctx) -> None:
    if ctx.type == "nn.Softmax2d":  # over the channels of (C, H, W) or (N, C, H, W)
        if ctx.rank(ctx.x()) not in (3, 4):
            raise ctx.fail(f"takes a 3-D or 4-D input, got {ctx.rank(ctx.x())}-D")
        ctx.become("Softmax", {"axis": -3}, inputs=[ctx.x()])
        return
    if not ctx.has("dim"):
        raise ctx.unsupported("no dim (torch's implicit-dim softmax)")
    if ctx.p("dtype") is not None:
        raise ctx.unsupported(f"dtype={ctx.p('dtype')}")
    op = "LogSoftmax" if "log" in ctx.type.lower() else "Softmax"
    x = ctx.x()
    if "softmin" in ctx.type.lower():  # softmin(x) = softmax(-x)
        ctx.floats(x)
        (x,) = ctx.emit("Neg", [x])
    ctx.become(op, {"axis": int(ctx.p("dim"))}, inputs=[x])


def _scalar(ctx: Ctx, value: float) -> object:
    x = ctx.x()
    dtype = x.dtype if x.dtype is not None and np.dtype(x.dtype).kind == "f" else np.float32
    return ctx.const(np.array(value, dtype))


@handles("nn.GLU", "F.glu")
def glu(ctx: Ctx) -> None:
    """a * sigmoid(b), a and b the two halves of `dim`."""
    ctx.floats(ctx.x())
    a, b = ctx.emit("Split", [ctx.x()], {"axis": int(ctx.p("dim", -1)), "sizes": None}, outputs=2)
    (gate,) = ctx.emit("Sigmoid", [b])
    ctx.emit("Mul", [a, gate], outputs=[ctx.node.outputs[0]])
    ctx.done()


@handles("nn.LogSigmoid", "F.logsigmoid")
def logsigmoid(ctx: Ctx) -> None:
    """-softplus(-x): softplus's threshold keeps it exact for large |x|, as torch's log1p form is."""
    ctx.floats(ctx.x())
    (neg,) = ctx.emit("Neg", [ctx.x()])
    (sp,) = ctx.emit("Softplus", [neg], {"beta": 1.0, "threshold": 20.0})
    ctx.emit("Neg", [sp], outputs=[ctx.node.outputs[0]])
    ctx.done()


@handles("nn.Softsign", "F.softsign")
def softsign(ctx: Ctx) -> None:
    """x / (1 + |x|); integers become float32 as in torch, bools are refused as torch does."""
    if ctx.x().dtype == np.bool_:
        raise ctx.fail("operand is bool; F.softsign takes numbers")
    (ab,) = ctx.emit("Abs", [ctx.x()])
    (den,) = ctx.emit("Add", [ab, _scalar(ctx, 1.0)])
    ctx.emit("Div", [ctx.x(), den], outputs=[ctx.node.outputs[0]])
    ctx.done()


SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


@handles("nn.SELU", "F.selu")
def selu(ctx: Ctx) -> None:
    """scale * elu(x, alpha) with torch's constants."""
    ctx.floats(ctx.x())
    (e,) = ctx.emit("Elu", [ctx.x()], {"alpha": SELU_ALPHA})
    ctx.emit("Mul", [e, _scalar(ctx, SELU_SCALE)], outputs=[ctx.node.outputs[0]])
    ctx.done()


@handles("nn.CELU", "F.celu")
def celu(ctx: Ctx) -> None:
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1)) = alpha * elu(x / alpha, 1)."""
    ctx.floats(ctx.x())
    alpha = float(ctx.p("alpha", 1.0))
    if alpha == 0:
        raise ctx.fail("alpha=0 (CELU divides by it)")
    if alpha == 1:
        ctx.become("Elu", {"alpha": 1.0}, inputs=[ctx.x()])
        return
    (scaled,) = ctx.emit("Mul", [ctx.x(), _scalar(ctx, 1 / alpha)])
    (e,) = ctx.emit("Elu", [scaled], {"alpha": 1.0})
    ctx.emit("Mul", [e, _scalar(ctx, alpha)], outputs=[ctx.node.outputs[0]])
    ctx.done()


@handles("nn.Tanhshrink", "F.tanhshrink")
def tanhshrink(ctx: Ctx) -> None:
    """x - tanh(x)."""
    ctx.floats(ctx.x())
    (t,) = ctx.emit("Tanh", [ctx.x()])
    ctx.emit("Sub", [ctx.x(), t], outputs=[ctx.node.outputs[0]])
    ctx.done()


@handles("nn.Softshrink", "F.softshrink")
def softshrink(ctx: Ctx) -> None:
    """x - clamp(x, -lambd, lambd): x - lambd above lambd, x + lambd below -lambd, 0 between."""
    ctx.floats(ctx.x())
    lambd = float(ctx.p("lambd", 0.5))
    if lambd < 0:
        raise ctx.fail(f"lambd={lambd} (torch takes lambd >= 0)")
    (c,) = ctx.emit("Clip", [ctx.x()], {"min": -lambd, "max": lambd})
    ctx.emit("Sub", [ctx.x(), c], outputs=[ctx.node.outputs[0]])
    ctx.done()


@handles("nn.Hardshrink", "F.hardshrink", "nn.Threshold", "F.threshold")
def shrink_threshold(ctx: Ctx) -> None:
    """hardshrink: x where |x| > lambd, else 0; threshold: x where x > threshold, else value."""
    x = ctx.x()
    ctx.floats(x)
    if "hardshrink" in ctx.type.lower():
        (probe,), bound, other = ctx.emit("Abs", [x]), float(ctx.p("lambd", 0.5)), 0.0
    else:
        probe, bound, other = x, float(ctx.p("threshold")), float(ctx.p("value"))
    (mask,) = ctx.emit("Greater", [probe, _scalar(ctx, bound)])
    ctx.emit("Where", [mask, x, _scalar(ctx, other)], outputs=[ctx.node.outputs[0]])
    ctx.done()
