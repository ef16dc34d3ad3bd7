"""pnnx ops that pick elements by index: Tensor.select and nn.Embedding -> Gather, Tensor.slice -> Slice (known
bounds as params, run-time bounds as inputs), pnnx.SliceIndexes -> a list Expression, Tensor.index (torch's
advanced indexing `x[rows, cols]`) -> Index."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.expression import expr_text
from engine.formats.pnnx.lowering.registry import handles
from engine.formats.pnnx.lowering.torch_params import axes_list
from engine.ir import Value
from engine.ops.expression import Expr, ExpressionError, Input, ListExpr, Lit, parse
from engine.ops.tensor import index_shape

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


@handles("torch.masked_select", "Tensor.masked_select")
def masked_select(ctx: Ctx) -> None:
    """The elements of x where the mask (both broadcast together) is true, in C order, as a 1-D tensor: x and the
    mask broadcast and flattened, the flat positions the mask's NonZero gives (a size known per call), gathered."""
    x, mask = ctx.arg("input", 0) or ctx.x(), ctx.arg("mask", 1)
    if mask is None:
        raise ctx.fail("has no $mask input")
    if mask.dtype is None or np.dtype(mask.dtype) != np.dtype(np.bool_):
        raise ctx.unsupported(f"a mask {mask.name!r} of type {mask.dtype} (torch takes a bool mask)")
    (both,) = ctx.emit("Where", [mask, x, x])  # x broadcast against the mask
    (shape,) = ctx.emit("Shape", [both])
    (wide,) = ctx.emit("Expand", [mask, shape], {"shape": None, "torch": True})
    (flat_mask,) = ctx.emit("Reshape", [wide], {"shape": [-1]})
    (flat_x,) = ctx.emit("Reshape", [both], {"shape": [-1]})
    (rows,) = ctx.emit("NonZero", [flat_mask], {"zero": "value", "dtype": "int64"})
    (positions,) = ctx.emit("Gather", [rows, ctx.const(np.array(0, np.int64))], {"axis": 0})
    ctx.become("Gather", {"axis": 0}, inputs=[flat_x, positions])


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


# -- Tensor.index --------------------------------------------------------------------------------------------------
# pnnx writes `x[rows, cols]` (aten::index: a list of index tensors, None for a dim taken whole) in one of two forms:
#   - `$input` and `$expr` operands: `$expr` is a list pnnx.Expression over the index tensors (`[@0,@1]`,
#     `[None,@0]`), its items sometimes with the arithmetic that made an index fused in (`[sub(@0,4)]`);
#   - one operand and an inline `expr=[[2,0],[1,-1]]`, where every index tensor was a constant
#     (pass_level3/fuse_index_expression.cpp). pnnx writes each constant as its first dim's worth of elements
#     only (attr.shape[0] values, the rest of its shape dropped), so the list is exact only when every index
#     tensor was 1-D; a static export of transformers' padding mask (`mask[batch_idx, kv_idx]`, arange views of
#     shapes (B,1,1,1) and (1,1,1,S)) reads `expr=[[0],[0]]` and has lost its indices.
LOSSY_INLINE = ("pnnx wrote constant index tensors inline and kept only their first dim's elements (a static "
                "export of index tensors of rank 2 or more, such as transformers' attention-mask indexing): the "
                "indices are lost; export with dynamic shapes (pnnx inputshape2=...) so they stay operands")


@handles("Tensor.index")
def tensor_index(ctx: Ctx) -> None:
    """-> Index(x, index tensors) on the dims the list's tensors stand at (`None` items: dims taken whole). Items
    computed in the list become Expressions; inline constants become constants when the annotated output shows
    they were 1-D, else the model is refused (LOSSY_INLINE). Bool masks and non-integer indices are refused."""
    x = ctx.x()
    expr = ctx.arg("expr")
    if expr is not None:
        node = expr.producer
        if node is None or node.op_type != "Expression" or len(ctx.node.inputs) != 2:
            raise ctx.unsupported(f"an index list {expr.name!r} that is not a pnnx list expression")
        tree, operands = _index_tree(ctx, node.params.get("expr")), node.inputs
    elif len(ctx.node.inputs) == 1 and ctx.has("expr"):
        tree, operands = _index_tree(ctx, ctx.p("expr")), []
    else:
        raise ctx.fail("needs an $input and an $expr operand, or one operand and an expr param")
    dims, indices, inline, dim = [], [], False, 0
    for item in tree.items:
        if isinstance(item, Lit) and item.value is None:
            dim += 1
            continue  # a dim taken whole (`x[:, idx]`)
        if isinstance(item, ListExpr):
            inline = True
            found = [_inline_index(ctx, item)]
        elif expr is None:  # pnnx leaves `@k` in the list for a constant of a type it cannot print (int32)
            raise ctx.unsupported(f"an inline index item {expr_text(item)} that is not a list of integers")
        else:
            found = _mask_rows(ctx, x, dim, _index_operand(ctx, item, operands))
        dims += range(dim, dim + len(found))
        indices += found
        dim += len(found)
    if not indices:
        raise ctx.unsupported(f"an index list {tree} without index tensors")
    for v in indices:
        if v.dtype is not None and np.dtype(v.dtype) not in (np.dtype(np.int64), np.dtype(np.int32)):
            what = "a bool mask" if np.dtype(v.dtype).kind in "bu" else f"a {np.dtype(v.dtype)} index"
            raise ctx.unsupported(f"{what} ({v.name!r}); only int64 and int32 index tensors are read")
    if inline:
        _check_inline(ctx, x, dims, indices)
    if expr is not None:
        ctx.folded.append(expr)
    ctx.become("Index", {"dims": dims}, inputs=[x, *indices])
    if expr is not None and not expr.consumers and expr not in ctx.graph.outputs:
        ctx.remove(expr.producer)  # a list of tensors has no value shape inference could give


def _mask_rows(ctx: Ctx, x: Value, dim: int, v: Value) -> list[Value]:
    """An index operand as the index tensors it stands for: itself, or for a bool mask over dims dim..dim+k-1,
    the k rows of its NonZero (what torch does with it: `x[mask]` is `x[mask.nonzero().unbind(1)]`), whose size
    the runtime learns per call (engine/runtime/extents.py)."""
    if v.dtype is None or np.dtype(v.dtype) != np.dtype(np.bool_):
        return [v]
    k = ctx.rank(v)
    if k == 0 or x.shape is None or dim + k > len(x.shape):
        raise ctx.unsupported(f"a bool mask ({v.name!r}) of rank {k} at dim {dim} of an input of shape {x.shape}")
    covered = x.shape[dim:dim + k]
    if any(m >= 0 and d >= 0 and m != d for m, d in zip(v.shape, covered, strict=True)):
        raise ctx.fail(f"bool mask {v.name!r} of shape {v.shape} does not match the dims {covered} it indexes")
    if any(m < 0 or d < 0 for m, d in zip(v.shape, covered, strict=True)):
        # Sizes known only at run time must still agree (torch raises IndexError): a smaller mask would select
        # from the front of x. The mask reshaped to the dim it indexes fails each run whose counts differ.
        if k > 1:
            raise ctx.unsupported(f"a bool mask ({v.name!r}) over {k} dims whose sizes are known only at run time "
                                  "(they could not be checked against the dims it indexes)")
        (dims,) = ctx.emit("Shape", [x], {"start": dim, "end": dim + 1})
        (v,) = ctx.emit("Reshape", [v, dims], {})
    (rows,) = ctx.emit("NonZero", [v], {"zero": "value", "dtype": "int64"})
    return [ctx.emit("Gather", [rows, ctx.const(np.array(j, np.int64))], {"axis": 0})[0] for j in range(k)]


def _index_tree(ctx: Ctx, text) -> ListExpr:
    try:
        tree = parse(text) if isinstance(text, str) else None
    except ExpressionError as e:
        raise ctx.fail(str(e)) from None
    if not isinstance(tree, ListExpr):
        raise ctx.unsupported(f"an index {text!r} that is not a list")
    return tree


def _inline_index(ctx: Ctx, item: ListExpr) -> Value:
    values = [it.value if isinstance(it, Lit) else it for it in item.items]
    if values and all(isinstance(v, bool) for v in values):
        raise ctx.unsupported(f"a bool mask {expr_text(item)} (its result's size depends on the data)")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ctx.unsupported(f"an inline index {expr_text(item)} that is not a list of integers")
    return ctx.const(np.array(values, np.int64))


def _index_operand(ctx: Ctx, item: Expr, operands: list[Value]) -> Value:
    """An index tensor of the `$expr` list: an operand as it is, or the arithmetic pnnx fused into the list
    (`sub(@0,4)`) as an Expression of its own."""
    if isinstance(item, Input):
        if item.index >= len(operands):
            raise ctx.fail(f"index list reads @{item.index} but has {len(operands)} operands")
        return operands[item.index]
    if isinstance(item, Lit):
        raise ctx.unsupported(f"an index item {expr_text(item)} that is not a tensor")
    return ctx.emit("Expression", list(operands), {"expr": expr_text(item)})[0]


def _check_inline(ctx: Ctx, x: Value, dims: list[int], indices: list[Value]) -> None:
    """The inline form is exact only for 1-D index tensors: the output the file annotates must then be what 1-D
    lists give (the broadcast length in place of the indexed dims); anything else lost its indices."""
    out = ctx.node.outputs[0]
    if x.shape is None or out.shape is None:
        raise ctx.unsupported("inline constant indices and no annotated shapes to check them against "
                              "(" + LOSSY_INLINE + ")")
    lengths = {len(v.const) for v in indices} - {1}
    if len(lengths) > 1:
        raise ctx.fail(f"inline index lists of lengths {sorted(lengths)} do not broadcast")
    if dims[-1] >= len(x.shape):
        raise ctx.fail(f"{len(dims)} indexed dims for a rank-{len(x.shape)} input")
    want = index_shape(tuple(x.shape), dims, (max(lengths, default=1),))
    got = list(out.shape)
    if len(got) != len(want) or any(g >= 0 and w >= 0 and g != w for g, w in zip(got, want, strict=False)):
        raise ctx.unsupported(f"inline indices {ctx.p('expr')} for an output of shape {tuple(got)} "
                              f"({LOSSY_INLINE})")
