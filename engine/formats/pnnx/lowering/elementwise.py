"""pnnx element-wise ops other than arithmetic (pnnx.Expression, expression.py) and activations: comparisons,
logical ops, where / masked_fill, clamp, and casts (Tensor.to)."""

from __future__ import annotations

import numpy as np

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.registry import handles
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


@handles(*_LOGICAL)
def logical(ctx: Ctx) -> None:
    ctx.become(_LOGICAL[ctx.type], {}, inputs=list(ctx.node.inputs[:2]))


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
