"""pnnx ops that join tensors or cut one into pieces: torch.cat -> Concat, torch.stack -> Stack, chunk / split /
tensor_split -> Split, unbind -> Split + Squeeze."""

from __future__ import annotations

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.registry import handles
from engine.formats.pnnx.lowering.torch_params import axes_list


@handles("torch.cat", "torch.concat")
def cat(ctx: Ctx) -> None:
    ctx.become("Concat", {"axis": int(ctx.p("dim", 0))}, inputs=list(ctx.node.inputs))


@handles("torch.stack")
def stack(ctx: Ctx) -> None:
    ctx.become("Stack", {"axis": int(ctx.p("dim", 0))}, inputs=list(ctx.node.inputs))


def _out_sizes(ctx: Ctx, axis: int) -> list[int] | None:
    """Split sizes read from the outputs' annotations, when every one is known."""
    sizes = []
    for v in ctx.node.outputs:
        if v.shape is None or not -len(v.shape) <= axis < len(v.shape) or v.shape[axis] < 0:
            return None
        sizes.append(v.shape[axis])
    return sizes


def _dim(ctx: Ctx, axis: int) -> int | None:
    shape = ctx.x().shape
    if shape is None or not -len(shape) <= axis < len(shape) or shape[axis] < 0:
        return None
    return shape[axis]


@handles("torch.chunk", "Tensor.chunk")
def chunk(ctx: Ctx) -> None:
    axis = int(ctx.p("dim", 0))
    # Without known sizes, Split's own rule (equal pieces of ceil(dim / outputs)) is torch.chunk's.
    ctx.become("Split", {"axis": axis, "sizes": _out_sizes(ctx, axis)}, inputs=[ctx.x()])


@handles("torch.split", "Tensor.split")
def split(ctx: Ctx) -> None:
    axis = int(ctx.p("dim", 0))
    x = ctx.arg("tensor") or ctx.arg("input") or ctx.x()
    sections = ctx.p("split_size_or_sections", ctx.p("split_size"))
    sizes = axes_list(sections) if isinstance(sections, list) else _out_sizes(ctx, axis)
    if sizes is None and isinstance(sections, int) and _dim(ctx, axis) is not None:
        dim = _dim(ctx, axis)
        # as many pieces as the node has outputs, checked before a list of them is made (a file's dim of 2**31
        # cut by 1 would be a list of 17 GB)
        pieces = max(1, -(-dim // sections)) if sections > 0 else 0
        if pieces != len(ctx.node.outputs):
            raise ctx.fail(f"split_size {sections} cuts a dim of {dim} into {pieces} pieces, not into the node's "
                           f"{len(ctx.node.outputs)} outputs")
        sizes = [sections] * (dim // sections) + ([dim % sections] if dim % sections else [])
    if sizes is None:
        raise ctx.unsupported("split sizes that depend on a dynamic dim")
    ctx.become("Split", {"axis": axis, "sizes": sizes}, inputs=[x])


@handles("torch.tensor_split")
def tensor_split(ctx: Ctx) -> None:
    axis = int(ctx.p("dim", 0))
    sizes = _out_sizes(ctx, axis)
    if sizes is None:
        raise ctx.unsupported("split sizes that depend on a dynamic dim")
    ctx.become("Split", {"axis": axis, "sizes": sizes}, inputs=[ctx.x()])


@handles("torch.unbind", "Tensor.unbind")
def unbind(ctx: Ctx) -> None:
    axis, outs = int(ctx.p("dim", 0)), ctx.node.outputs
    pieces = ctx.emit("Split", [ctx.x()], {"axis": axis, "sizes": [1] * len(outs)}, outputs=len(outs))
    for piece, out in zip(pieces, outs, strict=True):
        ctx.emit("Squeeze", [piece], {"axes": [axis]}, outputs=[out])
    ctx.done()
