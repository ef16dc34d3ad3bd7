"""pnnx's in-place writes, as the functional ops pnnx makes of them -> SliceAssign / IndexPut / Full.

pnnx functionalises `x[1:3] = y`, `x[..., 0] *= 2`, `x.copy_(y)`: each write becomes an op whose output is the
written tensor (Tensor.slice_copy `$self` `$src`, torch.slice_scatter, select_scatter, Tensor.index_put,
Tensor.copy), and readers of the old and the new contents read different operands; a view taken from the tensor
after the write is sliced from the op's output (pass_level5/fuse_slice_copy.cpp). So the canonical ops are
functional too and the planner's in-place rule (output 0 takes input 0's buffer only when nothing reads input 0
afterwards) keeps every reader right. `Tensor.fill` (the value written by `x[...] = 4.0`) is a Full of the
input's shape and dtype.
"""

from __future__ import annotations

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.indexing import INT_MAX, bound_inputs, selected, slice_spec
from engine.formats.pnnx.lowering.registry import handles
from engine.ir import Value
from engine.ops.expression import Input, ListExpr, parse


def _target_and_source(ctx: Ctx, target: str, source: str) -> tuple[Value, Value]:
    x, src = ctx.arg(target, 0), ctx.arg(source, 1)
    if x is None or src is None:
        raise ctx.fail(f"needs ${target} and ${source} inputs")
    return x, src


@handles("Tensor.slice_copy")
def slice_copy(ctx: Ctx) -> None:
    x, src = _target_and_source(ctx, "self", "src")
    spec = slice_spec(ctx)
    if spec.dynamic:
        ctx.become("SliceAssign", {"axes": spec.axes}, inputs=[x, src, *bound_inputs(ctx, spec)])
        return
    dropped = selected(spec)
    ctx.become("SliceAssign", {"starts": spec.starts, "ends": spec.ends, "axes": spec.axes, "steps": spec.steps,
                               "drop_axes": dropped}, inputs=[x, src])


@handles("torch.slice_scatter")
def slice_scatter(ctx: Ctx) -> None:
    x, src = _target_and_source(ctx, "input", "src")
    start, end = ctx.p("start", 0), ctx.p("end", INT_MAX)
    params = {"starts": [int(start)], "ends": [int(end)], "axes": [int(ctx.p("dim", 0))],
              "steps": [int(ctx.p("step", 1))], "drop_axes": [], "src": "exact"}
    ctx.become("SliceAssign", params, inputs=[x, src])


@handles("torch.select_scatter", "aten::select_scatter")
def select_scatter(ctx: Ctx) -> None:
    # aten::select_scatter keeps torch's positional operands: (input, src, dim, index), the ints as scalars
    x, src = _target_and_source(ctx, "input", "src")
    dim, index = (ctx.literal(ctx.node.inputs[i], name) if ctx.type.startswith("aten::") else ctx.p(name)
                  for i, name in ((2, "dim"), (3, "index")))
    if len(ctx.node.inputs) != (4 if ctx.type.startswith("aten::") else 2):
        raise ctx.fail(f"has {len(ctx.node.inputs)} inputs")
    index = int(index)
    params = {"starts": [index], "ends": [index + 1 if index != -1 else INT_MAX], "axes": [int(dim)],
              "steps": [1], "drop_axes": [int(dim)], "src": "exact"}
    ctx.become("SliceAssign", params, inputs=[x, src])


@handles("Tensor.copy")
def copy(ctx: Ctx) -> None:
    # x.copy_(src): src broadcast to x's shape and cast to its dtype; `non_blocking` is a transfer hint
    x, src = _target_and_source(ctx, "self", "src")
    ctx.become("SliceAssign", {"starts": [], "ends": [], "axes": [], "steps": [], "drop_axes": [], "src": "copy"},
               inputs=[x, src])


@handles("Tensor.index_put")
def index_put(ctx: Ctx) -> None:
    x, indices = ctx.arg("input", 0), ctx.arg("indices", 1)
    if x is None or indices is None:
        raise ctx.fail("needs $input and $indices inputs")
    values = ctx.arg("values")
    if values is None:
        if not ctx.has("values"):
            raise ctx.fail("has neither a $values input nor a values param")
        values = ctx.const(ctx.p("values"), x.dtype)
    params = {"accumulate": bool(ctx.p("accumulate", False))}
    ctx.become("IndexPut", params, inputs=[x, values, *_index_list(ctx, indices)])
    if not indices.consumers and indices not in ctx.graph.outputs:
        ctx.remove(indices.producer)  # a list of tensors has no value shape inference could give


def _index_list(ctx: Ctx, v: Value) -> list[Value]:
    """The index tensors of `$indices`: pnnx builds the list with an Expression `[@0,@1]` (lowered before this
    node), which is taken apart."""
    node = v.producer
    tree = parse(node.params["expr"]) if node is not None and node.op_type == "Expression" else None
    if not isinstance(tree, ListExpr) or not tree.items or not all(isinstance(t, Input) for t in tree.items):
        raise ctx.unsupported(f"indices {v.name!r} that are not a list of index tensors (None entries, "
                              "slices or run-time lists)")
    ctx.folded.append(v)
    return [node.inputs[t.index] for t in tree.items]


@handles("Tensor.fill")
def fill(ctx: Ctx) -> None:
    x, value = ctx.x(), ctx.arg("value")
    if x.dtype is None:
        raise ctx.unsupported("an input of unknown dtype")
    (shape,) = ctx.emit("Shape", [x])
    if value is None:
        if not ctx.has("value"):
            raise ctx.fail("has neither a $value input nor a value param")
        ctx.become("Full", {"value": ctx.p("value"), "dtype": str(x.dtype)}, inputs=[shape])
        return
    (cast,) = ctx.emit("Cast", [value], {"to": str(x.dtype)})  # fill_(tensor): a 0-d value
    ctx.become("Expand", {"shape": None}, inputs=[cast, shape])
