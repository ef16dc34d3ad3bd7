"""pnnx ops that move or relabel elements without computing: reshape / view, flatten, squeeze, unsqueeze, permute,
transpose, expand, repeat, flip, roll, pixel and channel shuffles, and the identities (dropout, contiguous,
clone, detach), which leave the graph."""

from __future__ import annotations

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.registry import handles
from engine.formats.pnnx.lowering.torch_params import axes_list

INT_MIN = -2147483648


@handles("Tensor.reshape", "Tensor.view", "torch.reshape")
def reshape(ctx: Ctx) -> None:
    dyn = ctx.arg("shape")
    if dyn is not None:
        ctx.become("Reshape", {"shape": None}, inputs=[ctx.arg("input", 0) or ctx.x(), dyn])
        return
    shape = axes_list(ctx.p("shape"))
    if shape is None:
        raise ctx.fail("has no shape")
    if 0 in shape:  # torch's 0 is an empty dim; the canonical Reshape reads 0 as "copy the input dim"
        raise ctx.unsupported(f"a zero-size dim in shape {shape}")
    ctx.become("Reshape", {"shape": shape}, inputs=[ctx.x()])


@handles("torch.flatten", "nn.Flatten", "Tensor.flatten")
def flatten(ctx: Ctx) -> None:
    start = 1 if ctx.type == "nn.Flatten" else 0
    ctx.become("Flatten", {"start_dim": int(ctx.p("start_dim", start)), "end_dim": int(ctx.p("end_dim", -1))},
               inputs=[ctx.x()])


@handles("torch.squeeze", "Tensor.squeeze")
def squeeze(ctx: Ctx) -> None:
    ctx.become("Squeeze", {"axes": axes_list(ctx.p("dim"))}, inputs=[ctx.x()])


@handles("torch.unsqueeze", "Tensor.unsqueeze")
def unsqueeze(ctx: Ctx) -> None:
    ctx.become("Unsqueeze", {"axes": axes_list(ctx.p("dim"))}, inputs=[ctx.x()])


@handles("Tensor.permute", "torch.permute")
def permute(ctx: Ctx) -> None:
    ctx.become("Transpose", {"perm": axes_list(ctx.p("dims"))}, inputs=[ctx.x()])


@handles("torch.transpose", "Tensor.transpose")
def transpose(ctx: Ctx) -> None:
    rank = ctx.rank(ctx.x())
    perm = list(range(rank))
    a, b = int(ctx.p("dim0")) % rank, int(ctx.p("dim1")) % rank
    perm[a], perm[b] = perm[b], perm[a]
    ctx.become("Transpose", {"perm": perm}, inputs=[ctx.x()])


@handles("Tensor.expand")
def expand(ctx: Ctx) -> None:
    sizes = ctx.arg("sizes")
    if sizes is not None:  # computed at run time (timm's class token: x.expand(x.shape[0], -1, -1))
        ctx.become("Expand", {}, inputs=[ctx.x(), sizes])
        return
    ctx.become("Expand", {"shape": axes_list(ctx.p("sizes", ctx.p("shape")))}, inputs=[ctx.x()])


@handles("Tensor.repeat", "torch.tile")
def repeat(ctx: Ctx) -> None:
    ctx.become("Tile", {"repeats": axes_list(ctx.p("sizes", ctx.p("dims")))}, inputs=[ctx.x()])


@handles("nn.PixelShuffle", "F.pixel_shuffle")
def pixel_shuffle(ctx: Ctx) -> None:
    ctx.become("PixelShuffle", {"upscale": int(ctx.p("upscale_factor"))}, inputs=[ctx.x()])


@handles("nn.PixelUnshuffle", "F.pixel_unshuffle")
def pixel_unshuffle(ctx: Ctx) -> None:
    r = int(ctx.p("downscale_factor"))
    shape = ctx.x().shape
    if shape is None or len(shape) != 4 or min(shape[1:]) < 0:
        raise ctx.unsupported("an input whose C, H and W are not static")
    _, c, h, w = shape
    (a,) = ctx.emit("Reshape", [ctx.x()], {"shape": [-1, c, h // r, r, w // r, r]})
    (t,) = ctx.emit("Transpose", [a], {"perm": [0, 1, 3, 5, 2, 4]})
    ctx.emit("Reshape", [t], {"shape": [-1, c * r * r, h // r, w // r]}, outputs=[ctx.node.outputs[0]])
    ctx.done()


@handles("nn.ChannelShuffle", "F.channel_shuffle", "torch.channel_shuffle")
def channel_shuffle(ctx: Ctx) -> None:
    ctx.become("ChannelShuffle", {"groups": int(ctx.p("groups"))}, inputs=[ctx.x()])


@handles("torch.flip", "Tensor.flip")
def flip(ctx: Ctx) -> None:
    dims = ctx.p("dims")
    axes = [int(dims)] if isinstance(dims, int) else [int(d) for d in dims]
    ctx.become("Slice", {"starts": [-1] * len(axes), "ends": [INT_MIN] * len(axes), "axes": axes,
                         "steps": [-1] * len(axes)}, inputs=[ctx.x()])


@handles("torch.roll", "Tensor.roll")
def roll(ctx: Ctx) -> None:
    shifts, dims = ctx.p("shifts"), ctx.p("dims")
    shifts = [int(shifts)] if isinstance(shifts, int) else [int(s) for s in shifts]
    dims = [int(dims)] if isinstance(dims, int) else [int(d) for d in (dims or [])]
    shape = ctx.x().shape
    if len(dims) != len(shifts) or shape is None or any(shape[d] < 0 for d in dims):
        raise ctx.unsupported("a roll without dims or over a dynamic dim")
    x = ctx.x()
    for i, (s, d) in enumerate(zip(shifts, dims, strict=True)):
        s %= shape[d]
        last = i == len(dims) - 1
        outputs = [ctx.node.outputs[0]] if last else 1
        if s == 0:
            x = ctx.emit("Identity", [x], outputs=outputs)[0]
            continue
        (tail,) = ctx.emit("Slice", [x], {"starts": [-s], "ends": [2147483647], "axes": [d], "steps": [1]})
        (head,) = ctx.emit("Slice", [x], {"starts": [0], "ends": [-s], "axes": [d], "steps": [1]})
        x = ctx.emit("Concat", [tail, head], {"axis": d}, outputs=outputs)[0]
    ctx.done()


@handles("nn.Dropout", "nn.Dropout1d", "nn.Dropout2d", "nn.Dropout3d", "nn.AlphaDropout", "F.dropout",
         "F.dropout1d", "F.dropout2d", "F.dropout3d", "F.alpha_dropout", "nn.Identity", "Tensor.contiguous",
         "Tensor.clone", "torch.clone", "Tensor.detach", "torch.detach")
def _identity(ctx: Ctx) -> None:
    ctx.bypass()
