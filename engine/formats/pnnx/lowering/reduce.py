"""pnnx reductions -> Reduce* (mean, sum, amax, amin, prod, logsumexp, max / min, norm) and ArgMax / ArgMin."""

from __future__ import annotations

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.registry import handles
from engine.formats.pnnx.lowering.torch_params import axes_list

_REDUCE = {"torch.mean": "ReduceMean", "torch.sum": "ReduceSum", "torch.amax": "ReduceMax",
           "torch.amin": "ReduceMin", "torch.prod": "ReduceProd", "torch.logsumexp": "ReduceLogSumExp"}


@handles(*_REDUCE, *(t.replace("torch.", "Tensor.") for t in _REDUCE))
def reduce(ctx: Ctx) -> None:
    op = _REDUCE[ctx.type.replace("Tensor.", "torch.")]
    ctx.become(op, {"axes": axes_list(ctx.p("dim")), "keepdims": bool(ctx.p("keepdim", False))}, inputs=[ctx.x()])


@handles("torch.max", "torch.min")
def max_min(ctx: Ctx) -> None:
    kind = "Max" if ctx.type == "torch.max" else "Min"
    if not ctx.has("dim"):
        ctx.become(f"Reduce{kind}", {"axes": None, "keepdims": False}, inputs=[ctx.x()])
        return
    dim, keep = int(ctx.p("dim")), bool(ctx.p("keepdim", False))
    outs = ctx.node.outputs
    ctx.emit(f"Reduce{kind}", [ctx.x()], {"axes": [dim], "keepdims": keep}, outputs=[outs[0]])
    if len(outs) > 1:
        ctx.emit(f"Arg{kind}", [ctx.x()], {"axis": dim, "keepdims": keep}, outputs=[outs[1]])
    ctx.done()


@handles("torch.argmax", "torch.argmin")
def argmax(ctx: Ctx) -> None:
    if not ctx.has("dim"):
        raise ctx.unsupported("no dim (argmax over the flattened tensor)")
    op = "ArgMax" if ctx.type == "torch.argmax" else "ArgMin"
    ctx.become(op, {"axis": int(ctx.p("dim")), "keepdims": bool(ctx.p("keepdim", False))}, inputs=[ctx.x()])


@handles("torch.norm", "torch.linalg.vector_norm")
def norm(ctx: Ctx) -> None:
    p = ctx.p("p", ctx.p("ord", 2))
    op = {1: "ReduceL1", 2: "ReduceL2", "fro": "ReduceL2"}.get(int(p) if isinstance(p, float) and p in (1, 2) else p)
    if op is None:
        raise ctx.unsupported(f"p={p}")
    dims = ctx.p("dim")
    axes = None if dims is None else ([int(dims)] if isinstance(dims, int) else [int(d) for d in dims])
    ctx.become(op, {"axes": axes, "keepdims": bool(ctx.p("keepdim", False))}, inputs=[ctx.x()])
