"""pnnx.Expression -> elementwise canonical ops (Add, Mul, Sqrt, ...) when it is plain float arithmetic.

`add(mul(@0,@1),1.5)` becomes Mul(@0, @1) then Add(·, const 1.5), the literal a 0-d constant of the tensors'
dtype so float32 stays float32. Anything else (shape arithmetic with size(), list results, integer tensors
where torch's promotion rules matter, functions without a canonical op) stays one `Expression` node, which
engine/ops/expression.py evaluates, usually at infer time.
"""

from __future__ import annotations

import numpy as np

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.registry import handles
from engine.ir import Value
from engine.ops.expression import Call, Expr, ExpressionError, Input, ListExpr, Lit, inputs_used, parse

BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "floor_divide": "FloorDiv", "remainder": "Mod",
          "pow": "Pow", "atan2": "Atan2", "fmod": "Fmod", "max": "Maximum", "min": "Minimum",
          "maximum": "Maximum", "minimum": "Minimum"}


UNARY = {name: name.capitalize() for name in (
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "cos", "cosh", "erf", "exp", "expm1",
    "floor", "log", "log10", "log1p", "neg", "reciprocal", "round", "rsqrt", "sign", "sin", "sinh", "sqrt",
    "square", "tan", "tanh", "trunc")}


def _calls_are_elementwise(tree: Expr) -> bool:
    if isinstance(tree, Input):
        return True
    if isinstance(tree, Lit):
        return isinstance(tree.value, (int, float)) and not isinstance(tree.value, bool)
    if isinstance(tree, ListExpr):
        return False
    arity = 2 if tree.name in BINARY else 1 if tree.name in UNARY else 0
    return len(tree.args) == arity and all(_calls_are_elementwise(a) for a in tree.args)


def _float_dtype(inputs: list[Value], used: set[int]) -> np.dtype | None:
    """The one floating dtype all referenced tensors share, else None (lists, ints, mixed, unknown)."""
    dtypes = set()
    for i in used:
        v = inputs[i]
        if (v.shape is None and not v.is_const) or v.dtype is None:
            return None  # a list operand or an operand of unknown type
        dtypes.add(np.dtype(v.dtype))
    if len(dtypes) != 1:
        return None
    (dtype,) = dtypes
    return dtype if dtype.kind == "f" else None


@handles("pnnx.Expression")
def expression(ctx: Ctx) -> None:
    expr = ctx.node.params.get("expr")
    if not isinstance(expr, str):
        raise ctx.fail("has no expr")
    try:
        tree = parse(expr)
    except ExpressionError as e:
        raise ctx.fail(str(e)) from None
    used = inputs_used(tree)
    if used and max(used) >= len(ctx.node.inputs):
        raise ctx.fail(f"expr {expr!r} reads @{max(used)} but the operator has {len(ctx.node.inputs)} inputs")
    dtype = _float_dtype(ctx.node.inputs, used) if used and _calls_are_elementwise(tree) else None
    if dtype is None:
        ctx.become("Expression", {"expr": expr})
        return
    if isinstance(tree, Input):
        ctx.become("Identity", {}, inputs=[ctx.node.inputs[tree.index]])
        return
    _emit(ctx, tree, dtype, ctx.node.inputs, out=ctx.node.outputs[0])
    ctx.done()


def _emit(ctx: Ctx, tree: Expr, dtype: np.dtype, inputs: list[Value], out: Value | None = None) -> Value:
    if isinstance(tree, Input):
        return inputs[tree.index]
    if isinstance(tree, Lit):
        return ctx.const(np.array(tree.value, dtype))
    assert isinstance(tree, Call)
    args = [_emit(ctx, a, dtype, inputs) for a in tree.args]
    op = BINARY.get(tree.name) or UNARY[tree.name]
    return ctx.emit(op, args, {}, outputs=[out] if out is not None else 1)[0]


def lower_item(ctx: Ctx, tree: Expr, inputs: list[Value], out: Value | None = None) -> Value:
    """One item of a list expression (`[add(@0,0.5),@1]`, its operands `inputs`) as a value of its own, emitted
    before ctx's node: the operand itself, elementwise ops for float arithmetic, else an Expression of the item
    alone. `out`, when given, is the value the item must land in (an Identity where the item is an operand)."""
    used = inputs_used(tree)
    dtype = _float_dtype(inputs, used) if used and _calls_are_elementwise(tree) else None
    if isinstance(tree, Input) or dtype is None:
        if isinstance(tree, Input) and out is None:
            return inputs[tree.index]
        op, params, ins = (("Identity", {}, [inputs[tree.index]]) if isinstance(tree, Input)
                           else ("Expression", {"expr": expr_text(tree)}, list(inputs)))
        return ctx.emit(op, ins, params, outputs=[out] if out is not None else 1)[0]
    return _emit(ctx, tree, dtype, inputs, out=out)


def expr_text(tree: Expr) -> str:
    """The pnnx text of a parsed expression (what `parse` read): a part of one (an item of a list) as an
    expression of its own."""
    if isinstance(tree, Input):
        return f"@{tree.index}"
    if isinstance(tree, Lit):
        return repr(tree.value) if isinstance(tree.value, float) else str(tree.value)
    if isinstance(tree, ListExpr):
        return "[" + ",".join(expr_text(t) for t in tree.items) + "]"
    return f"{tree.name}(" + ",".join(expr_text(t) for t in tree.args) + ")"
