"""TNN two-operand element-wise layers (Add, Mul, Maximum, Equal, ..., SquaredDifference) -> canonical ops. The
second operand is a second input or a constant stored in the layer's resource, placed the way TNN broadcasts it
(`place_element`, which the writer also uses to refuse constants a v1 file cannot express). Where, the one
three-operand layer, is here too."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import F32, Ctx
from engine.formats.tnn.lowering.registry import Handler, handles, register


def place_element(n: int, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Where a v1 constant of n elements (no dims stored) goes against an input of `shape`, as TNN reads it."""
    rank = len(shape)
    if n == 1:
        return ()
    if rank >= 2 and n == shape[1]:  # TNN's per-channel constant
        return (1, n) + (1,) * (rank - 2)
    if n == int(np.prod(shape)):
        return tuple(shape)
    if rank >= 3 and n == int(np.prod(shape[2:])):
        return (1, 1) + tuple(shape[2:])
    if rank and n == shape[-1]:
        return (n,)
    return None


def _element_const(c: Ctx, element: np.ndarray, x) -> np.ndarray:
    """The stored constant operand, shaped to broadcast the way TNN does."""
    dims = c.node.params.get("resource_dims", {}).get("element")
    if element.size == 1:
        return element.reshape(())
    if dims:  # v2 stores the ONNX dims: numpy broadcasting applies as is
        return element.reshape(dims)
    shape = c.shape(x)
    if shape is None:
        c.fail(f"cannot place a {element.size}-element constant without knowing the input shape")
    placed = place_element(element.size, shape)
    if placed is None:
        c.fail(f"a {element.size}-element constant does not broadcast against input shape {shape}")
    return element.reshape(placed)


def _operands(c: Ctx) -> list:
    ins = list(c.inputs)
    element = c.node.attrs.get("element")
    if element is not None and element.size and len(ins) == 1:
        data = _element_const(c, element, ins[0])
        if data.dtype.kind == "f":
            data = data.astype(F32)
        k = c.i(0, 1)
        const = c.const(data, "element")
        ins = [const, ins[0]] if k == 0 else [ins[0], const]
    if len(ins) < 2:
        c.fail("needs two operands: a second input or a stored constant")
    return ins


def _binary(op: str) -> Handler:
    def run(c: Ctx) -> None:
        ins = _operands(c)
        acc = ins[0]
        for v in ins[1:-1]:  # TNN folds more than two listed inputs left to right
            acc = c.tmp(op, [acc, v])
        c.out(op, [acc, ins[-1]])
    return run


@handles("SquaredDifference")
def lower_squared_difference(c: Ctx) -> None:
    d = c.tmp("Sub", _operands(c))
    c.out("Mul", [d, d])


register({t: _binary(op) for t, op in (("Add", "Add"), ("Sub", "Sub"), ("Mul", "Mul"), ("Div", "Div"),
                                       ("Maximum", "Maximum"), ("Minimum", "Minimum"), ("Pow", "Pow"),
                                       ("And", "And"), ("Or", "Or"), ("Xor", "Xor"), ("Equal", "Equal"),
                                       ("Greater", "Greater"), ("Less", "Less"))})


@handles("Where")
def lower_where(c: Ctx) -> None:
    # TNN's order is (x, y, condition), the condition read as `c != 0` (cpu_where_layer_acc.cc): a bool or an
    # integer condition; a float one TNN would read byte by byte, so it is refused
    if len(c.inputs) != 3:
        c.fail(f"takes (x, y, condition), has {len(c.inputs)} inputs")
    x, y, cond = c.inputs
    info = c.low.info(cond)  # the dtype shape inference gave it so far (the file types only the inputs)
    dtype = None if info is None else np.dtype(info.dtype)
    if dtype is None or dtype.kind not in "biu":
        c.fail(f"condition {cond.name!r} is {dtype}; TNN's Where reads a bool or integer condition")
    if dtype.kind != "b":
        cond = c.tmp("Cast", [cond], {"to": "bool"})
    c.out("Where", [cond, x, y])
