"""Writer rules for activations and one-input math ops (ReLU, Clip, PReLU, GELU, HardSwish, Abs, Exp, ...), and
`activation`, which writes the activation fused into a Conv or Gemm node as a layer of its own."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.writer.core import Writer, io_names, single_layer
from engine.formats.tnn.writer.registry import Rule, register
from engine.ir import Node

F32 = np.float32


def activation(w: Writer, act: str | None, p: dict | None, src: str, dst: str) -> None:
    """One TNN activation layer computing `act` from blob src into blob dst."""
    p = p or {}
    simple = {"relu": "ReLU", "relu6": "ReLU6", "sigmoid": "Sigmoid", "silu": "Swish", "tanh": "Tanh"}
    if act in simple:
        w.layer(simple[act], [src], [dst])
    elif act == "gelu" and p.get("approximate", "none") == "none":
        w.layer("GELU", [src], [dst])
    elif act in ("hardswish", "hardsigmoid"):
        w.layer("HardSwish" if act == "hardswish" else "HardSigmoid", [src], [dst],
                [float(p.get("alpha", 1 / 6)), float(p.get("beta", 0.5))])
    elif act == "leaky_relu":
        w.layer("PReLU", [src], [dst], [1, 0], [("name",), w.raw(F32([p.get("alpha", 0.01)]), False)])
    elif act == "clip":
        lo, hi = p.get("min"), p.get("max")
        if (lo, hi) == (0.0, 6.0):
            return w.layer("ReLU6", [src], [dst])
        w.layer("Clip", [src], [dst], [-np.inf if lo is None else float(lo), np.inf if hi is None else float(hi)])
    elif act == "elu":
        w.layer("Elu", [src], [dst], [float(p.get("alpha", 1.0))])
    else:
        w.unsupported(f"with activation {act!r}")


def simple(ltype: str) -> Rule:
    return lambda w, node: single_layer(w, node, ltype)


def with_floats(ltype: str, *names_defaults) -> Rule:
    return lambda w, node: single_layer(w, node, ltype, [float(node.params.get(n, d)) for n, d in names_defaults])


def clip(w: Writer, node: Node) -> None:
    lo, hi = node.params.get("min"), node.params.get("max")
    if lo is not None and hi is not None and (float(lo), float(hi)) == (0.0, 6.0):
        return simple("ReLU6")(w, node)
    x, y = io_names(w, node)
    w.layer("Clip", [x], [y], [-np.inf if lo is None else float(lo), np.inf if hi is None else float(hi)])


def leaky_relu(w: Writer, node: Node) -> None:
    x, y = io_names(w, node)
    w.layer("PReLU", [x], [y], [1, 0], [("name",), w.raw(F32([node.params.get("alpha", 0.01)]), False)])


def prelu(w: Writer, node: Node) -> None:
    slope = np.asarray(node.attrs["slope"], F32).reshape(-1)
    x, y = io_names(w, node)
    w.layer("PReLU", [x], [y], [int(slope.size == 1), 0], [("name",), w.raw(slope, False)])


def gelu(w: Writer, node: Node) -> None:
    if node.params.get("approximate", "none") == "none":
        return simple("GELU")(w, node)
    # TNN's GELU is the erf form: write 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) out
    x, y = io_names(w, node)
    steps = [("Power", [3.0, 1.0, 0.0], None), ("Mul", [1], F32(0.044715)), ("Add", [-1], "x"),
             ("Mul", [1], F32(np.sqrt(2 / np.pi))), ("Tanh", [], None), ("Add", [1], F32(1.0)),
             ("Mul", [1], F32(0.5)), ("Mul", [-1], "x")]
    src = x
    for k, (ltype, params, operand) in enumerate(steps):
        dst = y if k == len(steps) - 1 else w.tmp(f"gelu{k}")
        ins = [src, x] if operand == "x" else [src]
        res = [w.raw(operand, False)] if isinstance(operand, np.floating) else None
        w.layer(ltype, ins, [dst], params, res, name=f"{node.name}/{ltype.lower()}")
        src = dst


register({
    "Relu": simple("ReLU"), "Sigmoid": simple("Sigmoid"), "Tanh": simple("Tanh"), "Silu": simple("Swish"),
    "Softplus": simple("Softplus"), "Gelu": gelu, "Clip": clip, "LeakyRelu": leaky_relu, "PRelu": prelu,
    "HardSwish": with_floats("HardSwish", ("alpha", 1 / 6), ("beta", 0.5)),
    "HardSigmoid": with_floats("HardSigmoid", ("alpha", 0.2), ("beta", 0.5)),
    "Elu": with_floats("Elu", ("alpha", 1.0)),
    **{op: simple(op) for op in ("Abs", "Exp", "Log", "Neg", "Sqrt", "Rsqrt", "Square", "Floor", "Ceil", "Sign",
                                 "Reciprocal", "Erf", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Not")},
})
