"""pnnx's run-time lists of tensors: prim::ListConstruct, prim::ListUnpack, and aten::meshgrid, which takes one
list and returns another (pnnx has no level-2 pass for torch.meshgrid, so a dynamic export keeps the aten op).

A list never becomes a value of its own: pnnx builds one with a list Expression (`[add(@0,0.5),@1]`, what its
fuse_expression makes of prim::ListConstruct) or, where it kept it, a prim::ListConstruct, which is rewritten
into that Expression here; the ops reading the list take the Expression apart into one value per item. A list
from aten::meshgrid is read by a prim::ListUnpack only, whose outputs become the Meshgrid's. Any other producer
or reader of a list is refused at load, naming the op, file and line.
"""

from __future__ import annotations

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.expression import lower_item
from engine.formats.pnnx.lowering.registry import handles
from engine.ir import Value
from engine.ops.expression import ExpressionError, ListExpr, parse
from engine.ops.shape import MESHGRID_INDEXING

UNPACK = "pnnx:prim::ListUnpack"


@handles("prim::ListConstruct")
def list_construct(ctx: Ctx) -> None:
    # the same list as pnnx's own `[@0,@1,...]` Expression, which every list reader below takes apart
    if len(ctx.node.outputs) != 1:
        raise ctx.fail(f"has {len(ctx.node.outputs)} outputs")
    items = ",".join(f"@{i}" for i in range(len(ctx.node.inputs)))
    ctx.become("Expression", {"expr": f"[{items}]"})


def list_expression(ctx: Ctx, v: Value) -> ListExpr | None:
    """The parsed list Expression that produces `v`, else None."""
    node = v.producer
    if node is None or node.op_type != "Expression":
        return None
    try:
        tree = parse(node.params.get("expr", ""))
    except ExpressionError as e:
        raise ctx.fail(f"list operand {v.name!r}: {e}") from None
    return tree if isinstance(tree, ListExpr) else None


def list_items(ctx: Ctx, v: Value, outs: list[Value] | None = None) -> list[Value]:
    """The items of list `v` (a list Expression), each as a value of its own (into `outs` when given). The
    caller unlinks its node from `v`, then calls `drop_list`."""
    tree = list_expression(ctx, v)
    if tree is None:
        raise ctx.unsupported(f"list operand {v.name!r} not made by a list Expression or prim::ListConstruct")
    if outs is not None and len(outs) != len(tree.items):
        raise ctx.fail(f"unpacks {len(outs)} values from a list of {len(tree.items)} items")
    node = v.producer
    items = [lower_item(ctx, t, node.inputs, None if outs is None else outs[i]) for i, t in enumerate(tree.items)]
    ctx.folded.append(v)
    return items


def drop_list(ctx: Ctx, v: Value) -> None:
    """Removes the list Expression making `v` once nothing reads the list itself (a list has no value that
    shape inference could give)."""
    if not v.consumers and v not in ctx.graph.outputs and v.producer is not None:
        ctx.remove(v.producer)


@handles("prim::ListUnpack")
def list_unpack(ctx: Ctx) -> None:
    if len(ctx.node.inputs) != 1:
        raise ctx.fail(f"has {len(ctx.node.inputs)} inputs")
    (v,) = ctx.node.inputs
    node = v.producer
    if node is not None and node.op_type == "Meshgrid" and node.outputs == [v]:
        if len(ctx.node.outputs) != len(node.inputs):
            raise ctx.fail(f"unpacks {len(ctx.node.outputs)} values from a meshgrid of {len(node.inputs)} tensors")
        node.outputs = list(ctx.node.outputs)
        for o in node.outputs:
            o.producer = node
        ctx.folded.append(v)
        ctx.done()
        v.producer = None
        return
    if list_expression(ctx, v) is None:
        what = "a graph input" if node is None else f"{node.op_type} {node.name!r}"
        raise ctx.unsupported(f"a list made by {what} (only list Expressions, prim::ListConstruct and "
                              "aten::meshgrid are unpacked)")
    list_items(ctx, v, list(ctx.node.outputs))
    ctx.done()
    drop_list(ctx, v)


@handles("aten::meshgrid")
def meshgrid(ctx: Ctx) -> None:
    # aten::meshgrid(Tensor[] tensors, str indexing); torch before 1.10 traced it without indexing ('ij')
    if len(ctx.node.inputs) not in (1, 2) or len(ctx.node.outputs) != 1:
        raise ctx.fail(f"has {len(ctx.node.inputs)} inputs and {len(ctx.node.outputs)} outputs")
    indexing = ctx.literal(ctx.node.inputs[1], "indexing") if len(ctx.node.inputs) == 2 else "ij"
    if indexing not in MESHGRID_INDEXING:
        raise ctx.unsupported(f"indexing={indexing!r}")
    (out,) = ctx.node.outputs
    readers = [c for c in out.consumers if c.op_type != UNPACK]
    if readers or len(out.consumers) != 1 or out in ctx.graph.outputs:
        what = ", ".join(f"{c.op_type} {c.name!r}" for c in readers) or "the graph's outputs or several ops"
        raise ctx.unsupported(f"its list read by {what}, not by one prim::ListUnpack")
    v = ctx.node.inputs[0]
    ctx.become("Meshgrid", {"indexing": indexing}, inputs=list_items(ctx, v))
    drop_list(ctx, v)
