"""pnnx element-wise ops other than arithmetic (pnnx.Expression, expression.py) and activations: comparisons,
logical ops, where / masked_fill, clamp, addcmul, and casts (Tensor.to, Tensor.type_as)."""

from __future__ import annotations

import numpy as np

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.registry import handles
from engine.formats.pnnx.lowering.torch_params import TORCH_DTYPES
from engine.ir import Value


def _operand(ctx: Ctx, name: str, position: int, like: Value | None) -> Value:
    """A tensor input `$name`, or the scalar param `name` as a 0-d constant of `like`'s dtype (of the
    scalar's own kind, float32 / int64 / bool, when there is no tensor to follow)."""
    v = ctx.arg(name, position)
    if v is not None:
        return v
    if not ctx.has(name):
        raise ctx.fail(f"has neither an input nor a param {name!r}")
    value = ctx.p(name)
    if like is not None and like.dtype is not None:
        dtype = like.dtype
    else:
        dtype = np.bool_ if isinstance(value, bool) else np.int64 if isinstance(value, int) else np.float32
    return ctx.const(np.array(value, dtype))


_COMPARE = {"torch.eq": "Equal", "torch.ne": "NotEqual", "torch.lt": "Less", "torch.le": "LessEqual",
            "torch.gt": "Greater", "torch.ge": "GreaterEqual"}


@handles(*_COMPARE)
def compare(ctx: Ctx) -> None:
    x = ctx.arg("input", 0) or ctx.x()
    ctx.become(_COMPARE[ctx.type], {}, inputs=[x, _operand(ctx, "other", 1, x)])


_LOGICAL = {"torch.logical_and": "And", "torch.logical_or": "Or", "torch.logical_xor": "Xor"}
_BITWISE = {"torch.bitwise_and": "And", "torch.bitwise_or": "Or", "torch.bitwise_xor": "Xor"}


@handles(*_LOGICAL)
def logical(ctx: Ctx) -> None:
    ctx.become(_LOGICAL[ctx.type], {}, inputs=list(ctx.node.inputs[:2]))


@handles(*_BITWISE)
def bitwise(ctx: Ctx) -> None:
    """And / Or / Xor are bitwise on integers and logical on bools, as torch's bitwise ops; floats are refused."""
    x = ctx.x()
    other = _operand(ctx, "other", 1, x)
    for v in (x, other):
        if v.dtype is not None and np.dtype(v.dtype).kind not in "biu":
            raise ctx.fail(f"operand {v.name!r} is {np.dtype(v.dtype)} (bitwise ops take integers and bools)")
    ctx.become(_BITWISE[ctx.type], {}, inputs=[x, other])


@handles("torch.logical_not")
def logical_not(ctx: Ctx) -> None:
    ctx.become("Not", {}, inputs=[ctx.x()])


@handles("torch.where")
def where(ctx: Ctx) -> None:
    cond = ctx.arg("condition", 0) or ctx.x()
    tensors = [v for v in ctx.node.inputs if v is not cond]
    like = tensors[0] if tensors else None
    a, b = _operand(ctx, "input", 1, like), _operand(ctx, "other", 2, like)
    ctx.become("Where", {}, inputs=[cond, a, b])


@handles("Tensor.masked_fill")
def masked_fill(ctx: Ctx) -> None:
    x, mask = ctx.arg("input", 0) or ctx.x(), ctx.arg("mask", 1)
    if mask is None:
        raise ctx.fail("has no mask input")
    fill = ctx.arg("value") or _operand(ctx, "value", 2, x)
    ctx.become("Where", {}, inputs=[mask, fill, x])


@handles("torch.clamp", "torch.clip", "Tensor.clamp")
def clamp(ctx: Ctx) -> None:
    lo, hi = ctx.node.params.get("min"), ctx.node.params.get("max")
    if ctx.arg("min") is not None or ctx.arg("max") is not None:
        raise ctx.unsupported("tensor bounds")
    ctx.become("Clip", {"min": None if lo is None else float(lo), "max": None if hi is None else float(hi)},
               inputs=[ctx.x()])


@handles("aten::clamp_min", "aten::clamp_max")
def clamp_one_side(ctx: Ctx) -> None:
    """torch's positional (input, bound): what pnnx leaves of F.normalize's `norm.clamp_min(eps)` when it does not
    fold the pattern (torchvision's Swin-V2 attention), or `x.clamp_min(t)`. A number (an input-less expression,
    or a one-element constant of no higher rank than x) is a one-sided Clip; any other bound the elementwise
    Maximum / Minimum, broadcast (NaN from either side, as torch's), whose output shape and dtype the file's
    annotations then check (a tensor made from literal sizes, `torch.full((4,), 0.1)`, is such a bound)."""
    if len(ctx.node.inputs) != 2:
        raise ctx.fail(f"expects (input, bound), has {len(ctx.node.inputs)} inputs")
    x, bound = ctx.node.inputs
    lower_side = ctx.type == "aten::clamp_min"
    if x.dtype is None or np.dtype(x.dtype).kind not in "fiu":
        raise ctx.unsupported(f"an input of dtype {x.dtype} (numbers only)")
    integer = np.dtype(x.dtype).kind in "iu"
    number = bound.is_const and bound.const.size == 1 and bound.const.ndim <= len(x.shape or ())
    if number or (not bound.is_const and ctx.is_expression_literal(bound)):
        value = ctx.literal(bound, "bound")
        # torch promotes an integer input to float for a float bound: refused rather than computed as integers
        if not isinstance(value, (int, float)) or isinstance(value, bool) or (integer and isinstance(value, float)):
            raise ctx.unsupported(f"bound={value!r} for an input of dtype {x.dtype}")
        params = {"min": float(value), "max": None} if lower_side else {"min": None, "max": float(value)}
        ctx.become("Clip", params, inputs=[x])
        return
    if not bound.is_const and bound.dtype is not None and np.dtype(bound.dtype) != np.dtype(x.dtype):
        raise ctx.unsupported(f"a bound tensor of dtype {bound.dtype} for an input of dtype {x.dtype}")
    ctx.become("Maximum" if lower_side else "Minimum", {}, inputs=[x, bound])


@handles("Tensor.to", "Tensor.type")
def cast(ctx: Ctx) -> None:
    dtype = ctx.p("dtype")
    if dtype not in TORCH_DTYPES:
        raise ctx.unsupported(f"dtype={dtype}")
    ctx.become("Cast", {"to": TORCH_DTYPES[dtype]}, inputs=[ctx.x()])


@handles("Tensor.type_as")
def type_as(ctx: Ctx) -> None:
    other = ctx.arg("other", 1)
    if other is None:
        raise ctx.fail("has no $other input")
    if other.dtype is None:
        raise ctx.unsupported(f"an $other operand {other.name!r} of unknown dtype")
    ctx.folded.append(other)  # only its dtype is read
    ctx.become("Cast", {"to": str(np.dtype(other.dtype))}, inputs=[ctx.x()])


@handles("aten::addcmul")
def addcmul(ctx: Ctx) -> None:
    """input + value * tensor1 * tensor2 (ConvNeXt-V2's GRN), torch's positional operands: value arrives as a
    scalar operand."""
    if len(ctx.node.inputs) != 4:
        raise ctx.fail(f"expects (input, tensor1, tensor2, value), has {len(ctx.node.inputs)} inputs")
    x, t1, t2, v = ctx.node.inputs
    if any(o.dtype == np.bool_ for o in (x, t1, t2)):
        raise ctx.fail("has a bool operand (torch's addcmul takes numbers)")
    value = ctx.literal(v, "value")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ctx.unsupported(f"value={value!r}")
    (y,) = ctx.emit("Mul", [t1, t2])
    if value != 1:
        like = x.dtype if x.dtype is not None and np.dtype(x.dtype).kind == "f" else np.float32
        (y,) = ctx.emit("Mul", [y, ctx.const(np.array(value, like))])
    ctx.emit("Add", [x, y], outputs=[ctx.node.outputs[0]])
    ctx.done()


@handles("aten::tril", "aten::triu", "torch.tril", "torch.triu")
def trilu(ctx: Ctx) -> None:
    """The lower (tril) or upper (triu) triangle of the last two dims, from `diagonal` on; the aten forms keep
    torch's positional (input, diagonal)."""
    if ctx.type.startswith("aten::"):
        if len(ctx.node.inputs) != 2:
            raise ctx.fail(f"expects (input, diagonal), has {len(ctx.node.inputs)} inputs")
        diagonal = ctx.literal(ctx.node.inputs[1], "diagonal")
    else:
        diagonal = ctx.p("diagonal", 0)
    ctx.become("Trilu", {"upper": ctx.type.endswith("triu"), "k": int(diagonal)}, inputs=[ctx.x()])
