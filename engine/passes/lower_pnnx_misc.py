"""Less common pnnx ops: comparisons, where / masked_fill, logical ops, normalize / norm, 1-D pooling and
transposed conv (as their 2-D forms on an (N, C, 1, L) view), PixelUnshuffle, flip and roll."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from engine.passes.lower_pnnx import HANDLERS, PREFIX, Ctx, handles

if TYPE_CHECKING:
    from engine.ir import Value

INT_MIN = -2147483648


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


@handles("F.normalize")
def normalize(ctx: Ctx) -> None:
    p = float(ctx.p("p", 2.0))
    if p not in (1.0, 2.0):
        raise ctx.unsupported(f"p={p}")
    ctx.become("LpNormalize", {"axis": int(ctx.p("dim", 1)), "p": int(p), "eps": float(ctx.p("eps", 1e-12))},
               inputs=[ctx.x()])


@handles("torch.norm", "torch.linalg.vector_norm")
def norm(ctx: Ctx) -> None:
    p = ctx.p("p", ctx.p("ord", 2))
    op = {1: "ReduceL1", 2: "ReduceL2", "fro": "ReduceL2"}.get(int(p) if isinstance(p, float) and p in (1, 2) else p)
    if op is None:
        raise ctx.unsupported(f"p={p}")
    dims = ctx.p("dim")
    axes = None if dims is None else ([int(dims)] if isinstance(dims, int) else [int(d) for d in dims])
    ctx.become(op, {"axes": axes, "keepdims": bool(ctx.p("keepdim", False))}, inputs=[ctx.x()])


# -- 1-D forms through their 2-D ops -------------------------------------------------------------------------
def _params_2d(params: dict) -> dict:
    """1-D window params as 2-D ones over a height of 1: kernel (1, k), stride (1, s), padding (0, p), ..."""
    out = {k: v for k, v in params.items() if k != "$inputs"}
    for key, first in (("kernel_size", 1), ("stride", 1), ("dilation", 1), ("padding", 0), ("output_size", 1)):
        v = out.get(key)
        if v is not None:
            out[key] = [first, int(v if isinstance(v, int) else v[-1])]
    return out


def _as_2d(ctx: Ctx) -> None:
    """(N, C, L) -> Unsqueeze -> the 2-D pnnx op, lowered by its own handler -> Squeeze."""
    type_2d = ctx.type.replace("1d", "2d")
    (x4,) = ctx.emit("Unsqueeze", [ctx.x()], {"axes": [2]})
    (y4,) = ctx.emit(f"{PREFIX}{type_2d}", [x4], _params_2d(ctx.node.params))
    ctx.emit("Squeeze", [y4], {"axes": [2]}, outputs=[ctx.node.outputs[0]])
    HANDLERS[type_2d](Ctx(ctx.graph, y4.producer))
    ctx.done()


@handles("nn.MaxPool1d", "F.max_pool1d", "nn.AvgPool1d", "F.avg_pool1d")
def pool1d(ctx: Ctx) -> None:
    _as_2d(ctx)


@handles("nn.AdaptiveAvgPool1d", "F.adaptive_avg_pool1d", "nn.AdaptiveMaxPool1d", "F.adaptive_max_pool1d")
def adaptive_pool1d(ctx: Ctx) -> None:
    _as_2d(ctx)


@handles("nn.ConvTranspose1d")
def conv_transpose1d(ctx: Ctx) -> None:
    w, b = ctx.weight("weight"), ctx.weight("bias", required=False)

    def one(key: str, default: int) -> list[int]:
        v = ctx.p(key, [default])
        return [int(v if isinstance(v, int) else v[-1])]

    pad = one("padding", 0)[0]
    params = {"stride": [1] + one("stride", 1), "pads": [0, pad, 0, pad], "output_padding": [0] +
              one("output_padding", 0), "dilation": [1] + one("dilation", 1), "groups": int(ctx.p("groups", 1)),
              "activation": None, "activation_params": {}}
    attrs = {"weight": w.reshape(w.shape[0], w.shape[1], 1, w.shape[2])} | ({} if b is None else {"bias": b})
    (x4,) = ctx.emit("Unsqueeze", [ctx.x()], {"axes": [2]})
    (y4,) = ctx.emit("ConvTranspose", [x4], params, attrs)
    ctx.emit("Squeeze", [y4], {"axes": [2]}, outputs=[ctx.node.outputs[0]])
    ctx.done()


# -- layout --------------------------------------------------------------------------------------------------
@handles("nn.PixelUnshuffle", "F.pixel_unshuffle")
def pixel_unshuffle(ctx: Ctx) -> None:
    r = int(ctx.p("downscale_factor"))
    shape = ctx.x().shape
    if shape is None or len(shape) != 4 or min(shape[1:]) < 0:
        raise ctx.unsupported("an input whose C, H and W are not static")
    _, c, h, w = shape
    (a,) = ctx.emit("Reshape", [ctx.x()], {"shape": [-1, c, h // r, r, w // r, r]})
    (t,) = ctx.emit("Transpose", [a], {"perm": [0, 1, 3, 5, 2, 4]})
    ctx.emit("Reshape", [t], {"shape": [-1, c * r * r, h // r, w // r]}, outputs=[ctx.node.outputs[0]])
    ctx.done()


@handles("torch.flip", "Tensor.flip")
def flip(ctx: Ctx) -> None:
    dims = ctx.p("dims")
    axes = [int(dims)] if isinstance(dims, int) else [int(d) for d in dims]
    ctx.become("Slice", {"starts": [-1] * len(axes), "ends": [INT_MIN] * len(axes), "axes": axes,
                         "steps": [-1] * len(axes)}, inputs=[ctx.x()])


@handles("torch.roll", "Tensor.roll")
def roll(ctx: Ctx) -> None:
    shifts, dims = ctx.p("shifts"), ctx.p("dims")
    shifts = [int(shifts)] if isinstance(shifts, int) else [int(s) for s in shifts]
    dims = [int(dims)] if isinstance(dims, int) else [int(d) for d in (dims or [])]
    shape = ctx.x().shape
    if len(dims) != len(shifts) or shape is None or any(shape[d] < 0 for d in dims):
        raise ctx.unsupported("a roll without dims or over a dynamic dim")
    x = ctx.x()
    for i, (s, d) in enumerate(zip(shifts, dims, strict=True)):
        s %= shape[d]
        last = i == len(dims) - 1
        outputs = [ctx.node.outputs[0]] if last else 1
        if s == 0:
            x = ctx.emit("Identity", [x], outputs=outputs)[0]
            continue
        (tail,) = ctx.emit("Slice", [x], {"starts": [-s], "ends": [2147483647], "axes": [d], "steps": [1]})
        (head,) = ctx.emit("Slice", [x], {"starts": [0], "ends": [-s], "axes": [d], "steps": [1]})
        x = ctx.emit("Concat", [tail, head], {"axis": d}, outputs=outputs)[0]
    ctx.done()


# -- einsum ----------------------------------------------------------------------------------------------------
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
