"""pnnx matrix products -> Gemm / MatMul: nn.Linear and F.linear, torch.matmul / bmm / mm, torch.addmm / baddbmm,
and torch.einsum when the equation is one batched matrix product or a permutation (Transposes around one
MatMul)."""

from __future__ import annotations

import numpy as np

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.registry import handles
from engine.formats.pnnx.lowering.torch_params import const_input
from engine.ir import Value


@handles("nn.Linear", "F.linear")
def linear(ctx: Ctx) -> None:
    if ctx.type == "F.linear":
        w, b = const_input(ctx, "weight", 1), const_input(ctx, "bias", 2)
    else:
        w, b = ctx.weight("weight"), ctx.weight("bias", required=False)
    attrs = {"weight": w} | ({} if b is None else {"bias": b})
    ctx.become("Gemm", {"activation": None, "activation_params": {}}, attrs, inputs=[ctx.x()])


@handles("torch.matmul", "torch.bmm", "torch.mm", "Tensor.matmul", "torch.mv")
def matmul(ctx: Ctx) -> None:
    a = ctx.arg("input", 0)
    b = ctx.arg("other") or ctx.arg("mat2") or ctx.arg("vec") or ctx.arg("", 1)  # by position when untagged
    if a is None or b is None:
        raise ctx.fail("needs two inputs")
    ranks = {"torch.bmm": (3, 3), "torch.mm": (2, 2), "torch.mv": (2, 1)}.get(ctx.type)  # matmul broadcasts
    if ranks is not None and (ctx.rank(a), ctx.rank(b)) != ranks:
        raise ctx.fail(f"takes {ranks[0]}-D and {ranks[1]}-D operands, got {ctx.rank(a)}-D and {ctx.rank(b)}-D")
    ctx.become("MatMul", {}, inputs=[a, b])


@handles("torch.addmm", "torch.baddbmm")
def addmm(ctx: Ctx) -> None:
    """beta * input + alpha * (mat1 @ mat2), batched for baddbmm. GPT-2's Conv1D (a constant (in, out) weight, a
    bias vector, alpha = beta = 1) becomes one Gemm; otherwise MatMul, then Mul and Add for alpha and beta."""
    names = ("mat1", "mat2") if ctx.type == "torch.addmm" else ("batch1", "batch2")
    bias, a, b = ctx.arg("input", 0), ctx.arg(names[0], 1), ctx.arg(names[1], 2)
    if bias is None or a is None or b is None:
        raise ctx.fail(f"needs $input, ${names[0]} and ${names[1]} inputs")
    rank = 2 if ctx.type == "torch.addmm" else 3
    ctx.floats(bias, a, b)
    if len({np.dtype(v.dtype) for v in (bias, a, b) if v.dtype is not None}) > 1:
        raise ctx.fail("has operands of different dtypes (torch's addmm takes one dtype)")
    for v in (a, b):
        if ctx.rank(v) != rank:
            raise ctx.fail(f"{ctx.type} takes {rank}-D matrices, operand {v.name!r} is {ctx.rank(v)}-D")
    alpha, beta = float(ctx.p("alpha", 1)), float(ctx.p("beta", 1))
    out = ctx.node.outputs[0]
    if rank == 2 and b.is_const and bias.is_const and bias.const.ndim == 1 and alpha == beta == 1:
        weight, b_vec = ctx.const_array(b, "mat2").T.copy(), ctx.const_array(bias, "input")
        if b_vec.shape[0] == weight.shape[0]:
            ctx.become("Gemm", {"activation": None, "activation_params": {}}, {"weight": weight, "bias": b_vec},
                       inputs=[a])
            return
    (y,) = ctx.emit("MatMul", [a, b])
    if alpha != 1:
        (y,) = ctx.emit("Mul", [y, ctx.const(np.array(alpha, np.float32))])
    if beta == 0:  # torch ignores input then, NaN and inf included
        ctx.emit("Identity", [y], outputs=[out])
        ctx.folded.append(bias)
    else:
        if beta != 1:
            (bias,) = ctx.emit("Mul", [bias, ctx.const(np.array(beta, np.float32))])
        ctx.emit("Add", [bias, y], outputs=[out])
    ctx.done()


def _check_ranks(ctx: Ctx, terms: list[str]) -> None:
    for term, v in zip(terms, ctx.node.inputs, strict=True):
        if ctx.rank(v) != len(term):
            raise ctx.fail(f"operand {v.name!r} is {ctx.rank(v)}-D for the {len(term)} labels {term!r}")


def _perm_to(src: str, dst: str) -> list[int]:
    return [src.index(c) for c in dst]


def _arranged(ctx: Ctx, x: Value, src: str, dst: str) -> Value:
    """x with its axes (labelled by `src`) reordered as `dst`; no node when already in order."""
    return x if src == dst else ctx.emit("Transpose", [x], {"perm": _perm_to(src, dst)})[0]


@handles("torch.einsum")
def einsum(ctx: Ctx) -> None:
    """Equations that are one batched matrix product (`bhid,bhjd->bhij`, `ijkln,ijknm->ijklm`) or a permutation:
    Transposes around one MatMul. Each of the row, column and contracted groups must be a single label."""
    eq = str(ctx.p("equation", "")).replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if not arrow:  # implicit form (pnnx writes `ijlk` for a permutation): labels used once, sorted
        out = "".join(sorted(c for c in set(lhs) - {","} if lhs.count(c) == 1))
    if not out or "." in eq or any(len(set(t)) != len(t) for t in [*terms, out]) or len(terms) != len(ctx.node.inputs):
        raise ctx.unsupported(f"equation {eq!r}")
    if len(terms) == 1 and sorted(terms[0]) == sorted(out):
        _check_ranks(ctx, terms)
        ctx.become("Transpose", {"perm": _perm_to(terms[0], out)}, inputs=[ctx.x()])
        return
    if len(terms) != 2:
        raise ctx.unsupported(f"equation {eq!r}")
    a, b = terms
    batch = "".join(c for c in out if c in a and c in b)
    rows, cols = [c for c in a if c in out and c not in b], [c for c in b if c in out and c not in a]
    inner = [c for c in a if c in b and c not in out]
    if len(rows) != 1 or len(cols) != 1 or len(inner) != 1 or set(a) | set(b) != set(out) | set(inner):
        raise ctx.unsupported(f"equation {eq!r} (not a single batched matrix product)")
    _check_ranks(ctx, terms)
    x, y = ctx.node.inputs
    x = _arranged(ctx, x, a, batch + rows[0] + inner[0])
    y = _arranged(ctx, y, b, batch + inner[0] + cols[0])
    product = batch + rows[0] + cols[0]
    if product == out:
        ctx.emit("MatMul", [x, y], {}, outputs=[ctx.node.outputs[0]])
    else:
        (z,) = ctx.emit("MatMul", [x, y], {})
        ctx.emit("Transpose", [z], {"perm": _perm_to(product, out)}, outputs=[ctx.node.outputs[0]])
    ctx.done()
