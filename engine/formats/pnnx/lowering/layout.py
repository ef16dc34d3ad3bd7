"""pnnx ops that move or relabel elements without computing: reshape / view (and reshape_as), flatten, squeeze,
unsqueeze, permute, transpose / t, expand (and expand_as), repeat, repeat_interleave, flip, roll, pixel and channel
shuffles, and the identities (dropout, contiguous, clone, detach), which leave the graph."""

from __future__ import annotations

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.expression import expr_text
from engine.formats.pnnx.lowering.registry import handles
from engine.formats.pnnx.lowering.torch_params import axes_list
from engine.ir import Value
from engine.ops.expression import ListExpr, Lit, parse

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
    sizes = ctx.arg("sizes")  # a shape list computed from another tensor's shape
    if sizes is not None:
        ctx.become("Expand", {"shape": None, "torch": True}, inputs=[ctx.x(), sizes])
        return
    shape = axes_list(ctx.p("sizes", ctx.p("shape")))
    if shape is None:
        raise ctx.fail("has neither a $sizes input nor a sizes param")
    ctx.become("Expand", {"shape": shape, "torch": True}, inputs=[ctx.x()])


@handles("Tensor.reshape_as", "Tensor.expand_as", "Tensor.view_as")
def like_other(ctx: Ctx) -> None:
    """x shaped like `$other`: its shape read at run time (a host value, never scheduled)."""
    other = ctx.arg("other", 1)
    if other is None:
        raise ctx.fail("has no $other input")
    (shape,) = ctx.emit("Shape", [other])
    if ctx.type == "Tensor.expand_as":
        ctx.become("Expand", {"shape": None, "torch": True}, inputs=[ctx.x(), shape])
    else:
        ctx.become("Reshape", {"shape": None}, inputs=[ctx.x(), shape])


@handles("torch.t", "Tensor.t")
def t(ctx: Ctx) -> None:
    rank = ctx.rank(ctx.x())
    if rank > 2:
        raise ctx.fail(f"of a {rank}-D tensor (torch.t takes at most 2-D)")
    ctx.become("Transpose" if rank == 2 else "Identity", {"perm": [1, 0]} if rank == 2 else {}, inputs=[ctx.x()])


@handles("torch.repeat_interleave", "Tensor.repeat_interleave")
def repeat_interleave(ctx: Ctx) -> None:
    # output_size is only torch's hint of the result's length (to skip a device sync); shape inference checks it
    repeats = ctx.arg("repeats")
    reps = ctx.const_array(repeats, "repeats").astype(int).tolist() if repeats is not None else ctx.p("repeats")
    if not isinstance(reps, (int, list)) or isinstance(reps, bool):
        raise ctx.fail(f"repeats {reps!r}")
    x, dim = ctx.x(), ctx.p("dim")
    if dim is None:  # torch flattens first
        (x,) = ctx.emit("Flatten", [x], {"start_dim": 0, "end_dim": -1})
        dim = 0
    ctx.become("RepeatInterleave", {"axis": int(dim), "repeats": reps}, inputs=[x])


@handles("Tensor.repeat", "torch.tile")
def repeat(ctx: Ctx) -> None:
    sizes = ctx.arg("sizes") or ctx.arg("dims")
    if sizes is not None:
        _runtime_repeat(ctx, sizes)
        return
    ctx.become("Tile", {"repeats": axes_list(ctx.p("sizes", ctx.p("dims")))}, inputs=[ctx.x()])


def _runtime_repeat(ctx: Ctx, sizes: Value) -> None:
    """Repeats computed at run time (`query.repeat(batch, 1, 1)`, DETR's queries, exported with inputshape2): a
    list Expression whose items are literals or run-time sizes. A run-time count on a dim of static size 1 tiles
    the same as an Expand to it, so the literal counts become a Tile and the run-time ones an Expand (-1 keeps the
    others); a run-time count on any other dim is refused."""
    x, node = ctx.x(), sizes.producer
    tree = parse(node.params["expr"]) if node is not None and node.op_type == "Expression" else None
    if not isinstance(tree, ListExpr) or x.shape is None or len(tree.items) != len(x.shape):
        raise ctx.unsupported(f"run-time repeats {sizes.name!r} that are not a list of one count per dim")
    literal = [t.value if isinstance(t, Lit) and isinstance(t.value, int) and not isinstance(t.value, bool)
               else None for t in tree.items]
    if any(r is None and d != 1 for r, d in zip(literal, x.shape, strict=True)):
        raise ctx.unsupported(f"run-time repeats {expr_text(tree)} of dims not of static size 1 (input {x.shape})")
    tiled = x
    if any(r not in (None, 1) for r in literal):
        (tiled,) = ctx.emit("Tile", [x], {"repeats": [1 if r is None else r for r in literal]})
    target = ListExpr(tuple(Lit(-1) if r is not None else t for r, t in zip(literal, tree.items, strict=True)))
    (shape,) = ctx.emit("Expression", list(node.inputs), {"expr": expr_text(target)})
    ctx.folded.append(sizes)
    ctx.become("Expand", {"shape": None, "torch": True}, inputs=[tiled, shape])
    if not sizes.consumers and sizes not in ctx.graph.outputs:
        ctx.remove(node)


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


@handles("torch.narrow", "Tensor.narrow")
def narrow(ctx: Ctx) -> None:
    """A Slice of `length` elements from `start` (negative: from the end, which needs the dim's size)."""
    dim, start, length = int(ctx.p("dim")), int(ctx.p("start")), int(ctx.p("length"))
    if start < 0:
        shape = ctx.x().shape
        if shape is None or not -len(shape) <= dim < len(shape) or shape[dim] < 0:
            raise ctx.unsupported("a negative start on a dim of unknown size")
        start += shape[dim]
    ctx.become("Slice", {"starts": [start], "ends": [start + length], "axes": [dim], "steps": [1]},
               inputs=[ctx.x()])


@handles("Tensor.unflatten", "torch.unflatten")
def unflatten(ctx: Ctx) -> None:
    """dim split into `sizes` (one may be -1): a Reshape, the dims before it copied (0), the ones after it
    known from the file."""
    shape, dim = ctx.x().shape, int(ctx.p("dim"))
    sizes = axes_list(ctx.p("sizes"))
    rank = ctx.rank(ctx.x())
    dim %= max(rank, 1)
    after = shape[dim + 1:]
    if sizes is None or any(d < 0 for d in after) or (-1 in sizes and any(d < 0 for d in shape[:dim])):
        raise ctx.unsupported("sizes, or dims after the unflattened one, that are not known")
    ctx.become("Reshape", {"shape": [0] * dim + sizes + list(after)}, inputs=[ctx.x()])


@handles("nn.Dropout", "nn.Dropout1d", "nn.Dropout2d", "nn.Dropout3d", "nn.AlphaDropout", "F.dropout",
         "F.dropout1d", "F.dropout2d", "F.dropout3d", "F.alpha_dropout", "nn.Identity", "Tensor.contiguous",
         "Tensor.clone", "torch.clone", "Tensor.detach", "torch.detach", "torch.positive")
def _identity(ctx: Ctx) -> None:
    ctx.bypass()
