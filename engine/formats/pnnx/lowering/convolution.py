"""pnnx convolutions -> Conv / ConvTranspose: nn.Conv2d, nn.Conv1d and nn.ConvTranspose1d (as 2-D ops on an
(N, C, 1, L) view), nn.ConvTranspose2d, and their functional forms with constant weight operands. Param names on
the pnnx side are torch's (pnnx-format.md §7)."""

from __future__ import annotations

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.registry import handles
from engine.formats.pnnx.lowering.torch_params import const_input, pair, symmetric_pads


def _same_pads(kernel: list[int], dilation: list[int]) -> list[int]:
    # torch pads d*(k-1) in total, the odd extra element at the end (bottom / right)
    total = [d * (k - 1) for k, d in zip(kernel, dilation, strict=True)]
    return [total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2]


def _conv_params(ctx: Ctx, kernel: list[int]) -> dict:
    dilation = pair(ctx.p("dilation"), 1)
    padding = ctx.p("padding", 0)
    if padding == "same":
        pads = _same_pads(kernel, dilation)
    elif padding == "valid":
        pads = [0, 0, 0, 0]
    else:
        pads = symmetric_pads(padding)
    mode = ctx.p("padding_mode", "zeros")
    if mode not in ("zeros", "reflect", "replicate", "circular"):
        raise ctx.fail(f"unknown padding_mode {mode!r}")
    return {"stride": pair(ctx.p("stride"), 1), "pads": pads, "dilation": dilation,
            "groups": int(ctx.p("groups", 1)), "pad_mode": mode, "auto_pad": None,
            "activation": None, "activation_params": {}}


def conv_weights(ctx: Ctx, ndim: int):
    """(weight, bias): the module's attrs, or the functional form's constant `$weight` / `$bias` operands (a
    weight computed at run time is refused: the canonical convolutions hold their filters as attrs)."""
    if ctx.type.startswith("F."):
        w, b = const_input(ctx, "weight", 1), const_input(ctx, "bias", 2)
    else:
        w, b = ctx.weight("weight"), ctx.weight("bias", required=False)
    if w is None or w.ndim != ndim:
        raise ctx.fail(f"needs a {ndim}-D weight")
    return w, b


@handles("nn.Conv2d", "F.conv2d")
def conv2d(ctx: Ctx) -> None:
    w, b = conv_weights(ctx, 4)
    attrs = {"weight": w} if b is None else {"weight": w, "bias": b}
    ctx.become("Conv", _conv_params(ctx, list(w.shape[2:])), attrs, inputs=[ctx.x()])


@handles("nn.Conv1d", "F.conv1d")
def conv1d(ctx: Ctx) -> None:
    # (N, C, L) -> (N, C, 1, L): a 1-D conv is a 2-D conv with a 1-row kernel.
    w, b = conv_weights(ctx, 3)
    one = {k: [1, int(ctx.p(k, [d])[0])] for k, d in (("stride", 1), ("dilation", 1))}
    padding = ctx.p("padding", [0])
    padding = [padding] if isinstance(padding, int) else padding
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


@handles("nn.ConvTranspose2d", "F.conv_transpose2d")
def conv_transpose2d(ctx: Ctx) -> None:
    w, b = conv_weights(ctx, 4)
    params = {"stride": pair(ctx.p("stride"), 1), "pads": symmetric_pads(ctx.p("padding", 0)),
              "output_padding": pair(ctx.p("output_padding"), 0), "dilation": pair(ctx.p("dilation"), 1),
              "groups": int(ctx.p("groups", 1)), "activation": None, "activation_params": {}}
    ctx.become("ConvTranspose", params, {"weight": w} | ({} if b is None else {"bias": b}), inputs=[ctx.x()])


@handles("nn.ConvTranspose1d", "F.conv_transpose1d")
def conv_transpose1d(ctx: Ctx) -> None:
    w, b = conv_weights(ctx, 3)

    def one(key: str, default: int) -> list[int]:
        v = ctx.p(key, [default])
        return [int(v if isinstance(v, int) else v[-1])]

    pad = one("padding", 0)[0]
    params = {"stride": [1] + one("stride", 1), "pads": [0, pad, 0, pad], "output_padding": [0] +
              one("output_padding", 0), "dilation": [1] + one("dilation", 1), "groups": int(ctx.p("groups", 1)),
              "activation": None, "activation_params": {}}
    attrs = {"weight": w.reshape(w.shape[0], w.shape[1], 1, w.shape[2])} | ({} if b is None else {"bias": b})
    (x4,) = ctx.emit("Unsqueeze", [ctx.x()], {"axes": [2]})
    (y4,) = ctx.emit("ConvTranspose", [x4], params, attrs)
    ctx.emit("Squeeze", [y4], {"axes": [2]}, outputs=[ctx.node.outputs[0]])
    ctx.done()
