"""pnnx reductions -> Reduce* (mean, sum, amax, amin, prod, logsumexp, max / min, norm), ReduceVar (var, std with
a Sqrt), ArgMax / ArgMin, CumSum and TopK."""

from __future__ import annotations

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.registry import handles
from engine.formats.pnnx.lowering.torch_params import axes_list, dtype_param

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


@handles("torch.var", "torch.std", "Tensor.var", "Tensor.std", "aten::var", "aten::std")
def var_std(ctx: Ctx) -> None:
    """torch.var / std over `dim` (None: all) with `unbiased` (bool) or `correction` (int; pnnx may write it as
    `unbiased=0`). The aten forms keep torch's positional (input, unbiased) of a reduction over everything."""
    if ctx.type.startswith("aten::"):
        if len(ctx.node.inputs) != 2:
            raise ctx.unsupported(f"{len(ctx.node.inputs)} operands (only (input, unbiased) is lowered)")
        correction, axes, keep = int(bool(ctx.literal(ctx.node.inputs[1], "unbiased"))), None, False
    else:
        unbiased = ctx.p("correction", ctx.p("unbiased", True))
        correction = int(unbiased) if not isinstance(unbiased, float) else unbiased
        axes, keep = axes_list(ctx.p("dim")), bool(ctx.p("keepdim", False))
    params = {"axes": axes, "keepdims": keep, "correction": correction}
    if "var" in ctx.type:
        ctx.become("ReduceVar", params, inputs=[ctx.x()])
        return
    (v,) = ctx.emit("ReduceVar", [ctx.x()], params)
    ctx.emit("Sqrt", [v], outputs=[ctx.node.outputs[0]])
    ctx.done()


@handles("torch.cumsum", "Tensor.cumsum")
def cumsum(ctx: Ctx) -> None:
    x = ctx.x()
    if ctx.p("dtype") is not None:
        (x,) = ctx.emit("Cast", [x], {"to": dtype_param(ctx)})
    ctx.become("CumSum", {"axis": int(ctx.p("dim"))}, inputs=[x])


@handles("torch.topk", "Tensor.topk")
def topk(ctx: Ctx) -> None:
    k = ctx.arg("k")
    k = ctx.literal(k, "k") if k is not None else ctx.p("k")
    params = {"k": int(k), "axis": int(ctx.p("dim", -1)), "largest": bool(ctx.p("largest", True)),
              "sorted": bool(ctx.p("sorted", True))}
    ctx.become("TopK", params, inputs=[ctx.x()])


@handles("aten::sort", "aten::argsort")
def sort(ctx: Ctx) -> None:
    """torch.sort (values, indices) and torch.argsort (indices), which pnnx keeps as aten calls with torch's
    positional (input, dim, descending). Stable: equal values keep their order (torch.sort's stable=True; without
    it torch leaves the order of ties open)."""
    if len(ctx.node.inputs) != 3:
        raise ctx.fail(f"expects (input, dim, descending), has {len(ctx.node.inputs)} inputs")
    dim, descending = (ctx.literal(v, what) for v, what in zip(ctx.node.inputs[1:], ("dim", "descending"), strict=True))
    params = {"axis": int(dim), "descending": bool(descending)}
    if ctx.type == "aten::argsort":
        ctx.emit("Sort", [ctx.x()], params, outputs=[ctx.graph.value(f"{ctx.node.name}/values"), ctx.node.outputs[0]])
        ctx.done()
        return
    ctx.become("Sort", params, inputs=[ctx.x()])
