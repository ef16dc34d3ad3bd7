"""pnnx matrix products -> Gemm / MatMul: nn.Linear and F.linear, torch.matmul / bmm / mm, and torch.einsum when the
equation is one batched matrix product or a permutation (Transposes around one MatMul)."""

from __future__ import annotations

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


@handles("torch.matmul", "torch.bmm", "torch.mm", "Tensor.matmul")
def matmul(ctx: Ctx) -> None:
    a = ctx.arg("input", 0)
    b = ctx.arg("other") or ctx.arg("mat2")
    if b is None and len(ctx.node.inputs) == 2:
        b = ctx.node.inputs[1]
    if a is None or b is None:
        raise ctx.fail("needs two inputs")
    ctx.become("MatMul", {}, inputs=[a, b])


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
