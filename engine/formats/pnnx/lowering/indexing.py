"""pnnx ops that pick elements by index: Tensor.select and nn.Embedding -> Gather, Tensor.slice -> Slice (known
bounds as params, run-time bounds as inputs), pnnx.SliceIndexes -> a list Expression."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.registry import handles
from engine.formats.pnnx.lowering.torch_params import axes_list
from engine.ir import Value

INT_MAX = 2147483647  # pnnx clamps "to the end" (INT64_MAX) to this


@handles("Tensor.select", "torch.select")
def select(ctx: Ctx) -> None:
    index = ctx.const(np.array(int(ctx.p("index")), np.int64))
    ctx.become("Gather", {"axis": int(ctx.p("dim"))}, inputs=[ctx.x(), index])


@handles("nn.Embedding", "F.embedding")
def embedding(ctx: Ctx) -> None:
    """A row lookup: Gather on axis 0 of the table. The table is the module's weight, or F.embedding's `$weight`
    operand (a run-time tensor is fine). pnnx writes no padding_idx (it only masks gradients) and no
    scale_grad_by_freq / sparse beyond the flag (training only); max_norm renormalises the table in place
    during the forward pass and traces as its own aten::embedding_renorm_, which is not lowered."""
    if ctx.type == "F.embedding":
        table = ctx.arg("weight", 1)
        if table is None:
            raise ctx.fail("has no $weight input")
    else:
        table = ctx.const(ctx.weight("weight"), name=f"{ctx.node.name}.weight")
    ctx.become("Gather", {"axis": 0}, inputs=[table, ctx.x()])


@handles("torch.gather", "Tensor.gather")
def gather(ctx: Ctx) -> None:
    index = ctx.arg("index", 1)
    if index is None:
        raise ctx.fail("has no $index input")
    if ctx.p("sparse_grad", False):
        raise ctx.unsupported("sparse_grad=True")
    ctx.become("GatherElements", {"axis": int(ctx.p("dim"))}, inputs=[ctx.x(), index])


@handles("torch.index_select", "Tensor.index_select")
def index_select(ctx: Ctx) -> None:
    index = ctx.arg("index", 1)
    if index is None:
        raise ctx.fail("has no $index input")
    rank = ctx.rank(index)
    if rank > 1:
        raise ctx.fail(f"index of rank {rank} (index_select takes a 1-D index)")
    if rank == 0:  # torch keeps the axis for a 0-d index, which Gather would drop
        index = ctx.emit("Unsqueeze", [index], {"axes": [0]})[0]
    ctx.become("Gather", {"axis": int(ctx.p("dim"))}, inputs=[ctx.x(), index])


_BOUNDS = {"start": "starts", "end": "ends", "step": "steps", "starts": "starts", "ends": "ends", "steps": "steps"}


def known(v) -> bool:
    """A constant or an input-less expression: foldable into params now (what `Ctx.literal` accepts)."""
    node = v.producer
    return v.is_const or (node is not None and not node.inputs
                          and node.op_type in ("Expression", "pnnx:pnnx.Expression"))


@dataclass
class SliceSpec:
    """One pnnx slice (Tensor.slice, Tensor.slice_copy): per axis its start, end, step and select (INT_MAX: none),
    and the bounds computed at run time (operands, by canonical param name)."""
    axes: list[int]
    starts: list[int]
    ends: list[int]
    steps: list[int]
    selects: list[int]
    dynamic: dict[str, Value]


def slice_spec(ctx: Ctx) -> SliceSpec:
    """The single-axis form (`dim`, `start`, `end`, `step`, `select`) or the multi-axis form (`dims`, `starts`,
    ... `selects`) of a pnnx slice; known index operands are folded into params, run-time ones kept."""
    dynamic = {}
    for name in ("start", "end", "step", "select", "starts", "ends", "steps", "selects"):
        v = ctx.arg(name)
        if v is not None and (name in _BOUNDS and not known(v)):
            dynamic[_BOUNDS[name]] = v
        elif v is not None:
            ctx.node.params[name] = ctx.literal(v, name)
    if ctx.has("dims"):
        axes, starts, ends = axes_list(ctx.p("dims")), axes_list(ctx.p("starts")), axes_list(ctx.p("ends"))
        steps = axes_list(ctx.p("steps")) or [1] * len(axes)
        selects = axes_list(ctx.p("selects")) or [INT_MAX] * len(axes)
    else:
        axes, starts, ends = [int(ctx.p("dim", 0))], [int(ctx.p("start", 0))], [int(ctx.p("end", INT_MAX))]
        steps, selects = [int(ctx.p("step", 1))], [int(ctx.p("select", INT_MAX))]
    if not dynamic and not len(axes) == len(starts or []) == len(ends or []) == len(steps) == len(selects):
        raise ctx.fail("dims, starts, ends, steps and selects differ in length")
    if dynamic and any(sel != INT_MAX for sel in selects):
        raise ctx.unsupported(f"a select together with run-time bounds ({', '.join(dynamic)})")
    return SliceSpec(axes, starts, ends, steps, selects, dynamic)


def selected(spec: SliceSpec) -> list[int]:
    """Turns each select into a one-element range (`x[:, 2]` reads `x[:, 2:3]`); returns the selected axes."""
    dropped = []
    for i, sel in enumerate(spec.selects):
        if sel != INT_MAX:
            spec.starts[i], spec.ends[i], spec.steps[i] = sel, (sel + 1 if sel != -1 else INT_MAX), 1
            dropped.append(spec.axes[i])
    return dropped


def bound_inputs(ctx: Ctx, spec: SliceSpec) -> list[Value]:
    """starts, ends, steps as Slice inputs: the run-time operands as they are, the known bounds as constants."""
    static = {"starts": spec.starts, "ends": spec.ends, "steps": spec.steps}
    return [spec.dynamic[k] if k in spec.dynamic else ctx.const(static[k], np.int64)
            for k in ("starts", "ends", "steps")]


@handles("Tensor.slice")
def tensor_slice(ctx: Ctx) -> None:
    # Known index arguments become params; bounds computed at run time (from shapes) stay inputs of the Slice.
    spec = slice_spec(ctx)
    if spec.dynamic:
        # only `axes` stays a param: a pass reading starts/ends from params sees a slice it does not know
        ctx.become("Slice", {"axes": spec.axes}, inputs=[ctx.x(), *bound_inputs(ctx, spec)])
        return
    dropped = selected(spec)
    params = {"starts": spec.starts, "ends": spec.ends, "axes": spec.axes, "steps": spec.steps}
    if not dropped:
        ctx.become("Slice", params, inputs=[ctx.x()])
        return
    (cut,) = ctx.emit("Slice", [ctx.x()], params)
    ctx.emit("Squeeze", [cut], {"axes": dropped}, outputs=[ctx.node.outputs[0]])
    ctx.done()


@handles("pnnx.SliceIndexes")
def slice_indexes(ctx: Ctx) -> None:
    """A list of literals and operands (`indexes=(1,@0)`) feeding a multi-dim slice: a list Expression."""
    items = ctx.p("indexes")
    items = [items] if isinstance(items, (int, str)) else list(items or [])
    for it in items:
        if isinstance(it, str) and not (it.startswith("@") and it[1:].isdigit() and int(it[1:]) < len(ctx.node.inputs)):
            raise ctx.fail(f"index {it!r} is neither an int nor an operand @0..@{len(ctx.node.inputs) - 1}")
    ctx.become("Expression", {"expr": "[" + ",".join(str(it) for it in items) + "]"})
