"""pnnx pooling -> MaxPool / AvgPool / Global*Pool / Adaptive*Pool; the 1-D forms as their 2-D ops on an
(N, C, 1, L) view."""

from __future__ import annotations

from engine.formats.pnnx.lowering.context import PREFIX, Ctx
from engine.formats.pnnx.lowering.registry import HANDLERS, handles
from engine.formats.pnnx.lowering.torch_params import pair, symmetric_pads


@handles("nn.MaxPool2d", "F.max_pool2d", "nn.AvgPool2d", "F.avg_pool2d")
def pool2d(ctx: Ctx) -> None:
    ctx.drop_outputs(1, "the pooling indices output")  # written return_indices=True even when unused
    kernel = pair(ctx.p("kernel_size"))
    stride = ctx.p("stride")
    params = {"kernel": kernel, "stride": kernel if stride in (None, []) else pair(stride, 1),
              "pads": symmetric_pads(ctx.p("padding", 0)),
              "ceil_mode": bool(ctx.p("ceil_mode", False)), "auto_pad": None}
    if "max" in ctx.type.lower():
        ctx.become("MaxPool", params | {"dilation": pair(ctx.p("dilation"), 1)}, inputs=[ctx.x()])
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
    # pnnx writes torch's None (keep that dim, as in CRNN heads' (1, None)) as 0; a real 0 would give an empty
    # output, which no export means
    size = [None if s == 0 else s for s in size]
    kind = "Max" if "max" in ctx.type.lower() else "Avg"
    if size == [1, 1]:
        ctx.become(f"Global{kind}Pool", {}, inputs=[ctx.x()])
    else:
        ctx.become(f"Adaptive{kind}Pool", {"output_size": size}, inputs=[ctx.x()])


def _params_2d(params: dict) -> dict:
    """1-D window params as 2-D ones over a height of 1: kernel (1, k), stride (1, s), padding (0, p), ..."""
    out = {k: v for k, v in params.items() if k != "$inputs"}
    for key, first in (("kernel_size", 1), ("stride", 1), ("dilation", 1), ("padding", 0), ("output_size", 1)):
        v = out.get(key)
        if v is not None:
            out[key] = [first, int(v if isinstance(v, int) else v[-1])]
    return out


def _as_2d(ctx: Ctx) -> None:
    """(N, C, L) -> Unsqueeze -> the 2-D pnnx op, lowered by its own handler -> Squeeze."""
    type_2d = ctx.type.replace("1d", "2d")
    (x4,) = ctx.emit("Unsqueeze", [ctx.x()], {"axes": [2]})
    (y4,) = ctx.emit(f"{PREFIX}{type_2d}", [x4], _params_2d(ctx.node.params))
    ctx.emit("Squeeze", [y4], {"axes": [2]}, outputs=[ctx.node.outputs[0]])
    inner = ctx.inner(y4.producer)
    HANDLERS[type_2d](inner)
    ctx.place(inner)
    ctx.done()


@handles("nn.MaxPool1d", "F.max_pool1d", "nn.AvgPool1d", "F.avg_pool1d")
def pool1d(ctx: Ctx) -> None:
    _as_2d(ctx)


@handles("nn.AdaptiveAvgPool1d", "F.adaptive_avg_pool1d", "nn.AdaptiveMaxPool1d", "F.adaptive_max_pool1d")
def adaptive_pool1d(ctx: Ctx) -> None:
    _as_2d(ctx)
