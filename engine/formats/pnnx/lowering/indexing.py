"""pnnx ops that pick elements by index: Tensor.select and nn.Embedding -> Gather, Tensor.slice -> Slice (known
bounds as params, run-time bounds as inputs), pnnx.SliceIndexes -> a list Expression."""

from __future__ import annotations

import numpy as np

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.registry import handles
from engine.formats.pnnx.lowering.torch_params import axes_list

INT_MAX = 2147483647  # pnnx clamps "to the end" (INT64_MAX) to this


@handles("Tensor.select", "torch.select")
def select(ctx: Ctx) -> None:
    index = ctx.const(np.array(int(ctx.p("index")), np.int64))
    ctx.become("Gather", {"axis": int(ctx.p("dim"))}, inputs=[ctx.x(), index])


@handles("nn.Embedding")
def embedding(ctx: Ctx) -> None:
    table = ctx.const(ctx.weight("weight"), name=f"{ctx.node.name}.weight")
    ctx.become("Gather", {"axis": 0}, inputs=[table, ctx.x()])


_BOUNDS = {"start": "starts", "end": "ends", "step": "steps", "starts": "starts", "ends": "ends", "steps": "steps"}


def _known(v) -> bool:
    """A constant or an input-less expression: foldable into params now (what `Ctx.literal` accepts)."""
    node = v.producer
    return v.is_const or (node is not None and not node.inputs
                          and node.op_type in ("Expression", "pnnx:pnnx.Expression"))


@handles("Tensor.slice")
def tensor_slice(ctx: Ctx) -> None:
    # Known index arguments become params; bounds computed at run time (from shapes) stay inputs of the Slice.
    dynamic = {}
    for name in ("start", "end", "step", "select", "starts", "ends", "steps", "selects"):
        v = ctx.arg(name)
        if v is not None and (name in _BOUNDS and not _known(v)):
            dynamic[_BOUNDS[name]] = v
        elif v is not None:
            ctx.node.params[name] = ctx.literal(v, name)
    if ctx.has("dims"):
        axes, starts, ends = axes_list(ctx.p("dims")), axes_list(ctx.p("starts")), axes_list(ctx.p("ends"))
        steps = axes_list(ctx.p("steps")) or [1] * len(axes)
        selects = axes_list(ctx.p("selects")) or [INT_MAX] * len(axes)
    else:
        axes, starts, ends = [int(ctx.p("dim", 0))], [int(ctx.p("start", 0))], [int(ctx.p("end", INT_MAX))]
        steps, selects = [int(ctx.p("step", 1))], [INT_MAX]
    if dynamic:
        _dynamic_slice(ctx, axes, {"starts": starts, "ends": ends, "steps": steps}, selects, dynamic)
        return
    if not len(axes) == len(starts) == len(ends) == len(steps) == len(selects):
        raise ctx.fail("dims, starts, ends, steps and selects differ in length")
    dropped = []
    for i, sel in enumerate(selects):
        if sel != INT_MAX:  # a select keeps one index, then the axis goes
            starts[i], ends[i], steps[i] = sel, (sel + 1 if sel != -1 else INT_MAX), 1
            dropped.append(axes[i])
    params = {"starts": starts, "ends": ends, "axes": axes, "steps": steps}
    if not dropped:
        ctx.become("Slice", params, inputs=[ctx.x()])
        return
    (cut,) = ctx.emit("Slice", [ctx.x()], params)
    ctx.emit("Squeeze", [cut], {"axes": dropped}, outputs=[ctx.node.outputs[0]])
    ctx.done()


def _dynamic_slice(ctx: Ctx, axes, static: dict, selects, dynamic: dict) -> None:
    """Slice(x, starts, ends, steps): the run-time operands as they are, the known bounds as int64 constants."""
    if any(sel != INT_MAX for sel in selects):
        raise ctx.unsupported(f"a select together with run-time bounds ({', '.join(dynamic)})")
    bounds = [dynamic[k] if k in dynamic else ctx.const(static[k], np.int64) for k in ("starts", "ends", "steps")]
    # only `axes` stays a param: a pass reading starts/ends from params sees a slice it does not know
    ctx.become("Slice", {"axes": axes}, inputs=[ctx.x(), *bounds])


@handles("pnnx.SliceIndexes")
def slice_indexes(ctx: Ctx) -> None:
    """A list of literals and operands (`indexes=(1,@0)`) feeding a multi-dim slice: a list Expression."""
    items = ctx.p("indexes")
    items = [items] if isinstance(items, (int, str)) else list(items or [])
    for it in items:
        if isinstance(it, str) and not (it.startswith("@") and it[1:].isdigit() and int(it[1:]) < len(ctx.node.inputs)):
            raise ctx.fail(f"index {it!r} is neither an int nor an operand @0..@{len(ctx.node.inputs) - 1}")
    ctx.become("Expression", {"expr": "[" + ",".join(str(it) for it in items) + "]"})
