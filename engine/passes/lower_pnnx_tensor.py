"""pnnx shape, cut/join, reduction, matmul and attention ops -> canonical ops (Reshape, Slice, Split, ...)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from engine.passes.lower_pnnx import handles

if TYPE_CHECKING:
    from engine.passes.lower_pnnx import Ctx

INT_MAX = 2147483647  # pnnx clamps "to the end" (INT64_MAX) to this


def _axes(v) -> list[int] | None:
    if v is None:
        return None
    return [int(v)] if isinstance(v, int) else [int(a) for a in v]


# -- layout -------------------------------------------------------------------------------------------------
@handles("Tensor.reshape", "Tensor.view", "torch.reshape")
def reshape(ctx: Ctx) -> None:
    dyn = ctx.arg("shape")
    if dyn is not None:
        ctx.become("Reshape", {"shape": None}, inputs=[ctx.arg("input", 0) or ctx.x(), dyn])
        return
    shape = _axes(ctx.p("shape"))
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
    ctx.become("Squeeze", {"axes": _axes(ctx.p("dim"))}, inputs=[ctx.x()])


@handles("torch.unsqueeze", "Tensor.unsqueeze")
def unsqueeze(ctx: Ctx) -> None:
    ctx.become("Unsqueeze", {"axes": _axes(ctx.p("dim"))}, inputs=[ctx.x()])


@handles("Tensor.permute", "torch.permute")
def permute(ctx: Ctx) -> None:
    ctx.become("Transpose", {"perm": _axes(ctx.p("dims"))}, inputs=[ctx.x()])


@handles("torch.transpose", "Tensor.transpose")
def transpose(ctx: Ctx) -> None:
    rank = ctx.rank(ctx.x())
    perm = list(range(rank))
    a, b = int(ctx.p("dim0")) % rank, int(ctx.p("dim1")) % rank
    perm[a], perm[b] = perm[b], perm[a]
    ctx.become("Transpose", {"perm": perm}, inputs=[ctx.x()])


@handles("Tensor.expand")
def expand(ctx: Ctx) -> None:
    ctx.become("Expand", {"shape": _axes(ctx.p("sizes", ctx.p("shape")))}, inputs=[ctx.x()])


@handles("Tensor.repeat", "torch.tile")
def repeat(ctx: Ctx) -> None:
    ctx.become("Tile", {"repeats": _axes(ctx.p("sizes", ctx.p("dims")))}, inputs=[ctx.x()])


_DTYPES = {"torch.float": "float32", "torch.float32": "float32", "torch.float16": "float16",
           "torch.half": "float16", "torch.float64": "float64", "torch.double": "float64", "torch.int": "int32",
           "torch.int32": "int32", "torch.long": "int64", "torch.int64": "int64", "torch.bool": "bool",
           "torch.uint8": "uint8", "torch.int8": "int8"}


@handles("Tensor.to", "Tensor.type")
def cast(ctx: Ctx) -> None:
    dtype = ctx.p("dtype")
    if dtype not in _DTYPES:
        raise ctx.unsupported(f"dtype={dtype}")
    ctx.become("Cast", {"to": _DTYPES[dtype]}, inputs=[ctx.x()])


# -- join and cut ------------------------------------------------------------------------------------------
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
    sizes = _axes(sections) if isinstance(sections, list) else _out_sizes(ctx, axis)
    if sizes is None and isinstance(sections, int) and _dim(ctx, axis) is not None:
        dim = _dim(ctx, axis)
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


@handles("Tensor.select", "torch.select")
def select(ctx: Ctx) -> None:
    index = ctx.const(np.array(int(ctx.p("index")), np.int64))
    ctx.become("Gather", {"axis": int(ctx.p("dim"))}, inputs=[ctx.x(), index])


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
        axes, starts, ends = _axes(ctx.p("dims")), _axes(ctx.p("starts")), _axes(ctx.p("ends"))
        steps = _axes(ctx.p("steps")) or [1] * len(axes)
        selects = _axes(ctx.p("selects")) or [INT_MAX] * len(axes)
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


# -- reductions, clamp, matmul --------------------------------------------------------------------------------
_REDUCE = {"torch.mean": "ReduceMean", "torch.sum": "ReduceSum", "torch.amax": "ReduceMax",
           "torch.amin": "ReduceMin", "torch.prod": "ReduceProd", "torch.logsumexp": "ReduceLogSumExp"}


@handles(*_REDUCE, *(t.replace("torch.", "Tensor.") for t in _REDUCE))
def reduce(ctx: Ctx) -> None:
    op = _REDUCE[ctx.type.replace("Tensor.", "torch.")]
    ctx.become(op, {"axes": _axes(ctx.p("dim")), "keepdims": bool(ctx.p("keepdim", False))}, inputs=[ctx.x()])


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


@handles("torch.clamp", "torch.clip", "Tensor.clamp")
def clamp(ctx: Ctx) -> None:
    lo, hi = ctx.node.params.get("min"), ctx.node.params.get("max")
    if ctx.arg("min") is not None or ctx.arg("max") is not None:
        raise ctx.unsupported("tensor bounds")
    ctx.become("Clip", {"min": None if lo is None else float(lo), "max": None if hi is None else float(hi)},
               inputs=[ctx.x()])


@handles("torch.matmul", "torch.bmm", "torch.mm", "Tensor.matmul")
def matmul(ctx: Ctx) -> None:
    a = ctx.arg("input", 0)
    b = ctx.arg("other") or ctx.arg("mat2")
    if b is None and len(ctx.node.inputs) == 2:
        b = ctx.node.inputs[1]
    if a is None or b is None:
        raise ctx.fail("needs two inputs")
    ctx.become("MatMul", {}, inputs=[a, b])


# -- attention -------------------------------------------------------------------------------------------------
@handles("F.scaled_dot_product_attention")
def sdpa(ctx: Ctx) -> None:
    if ctx.p("enable_gqa", False):
        raise ctx.unsupported("enable_gqa=True")
    names = ("query", "key", "value")
    q, k, v = (ctx.arg(n, i) for i, n in enumerate(names))
    if q is None or k is None or v is None:
        raise ctx.fail("needs query, key and value inputs")
    mask = ctx.arg("attn_mask", 3)
    scale = ctx.node.params.get("scale")
    params = {"scale": None if scale is None else float(scale), "is_causal": bool(ctx.p("is_causal", False))}
    ctx.become("Attention", params, inputs=[q, k, v] + ([mask] if mask is not None else []))


@handles("nn.MultiheadAttention")
def multihead_attention(ctx: Ctx) -> None:
    from engine.passes.lower_pnnx_mha import lower_mha

    lower_mha(ctx)
