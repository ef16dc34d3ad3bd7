"""Writer rules for two-operand element-wise ops (Add, Sub, Mul, Div, Maximum, Minimum, Pow): a constant operand is
stored in the layer's resource; a v1 file refuses one its reader would place differently."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.binary import place_element
from engine.formats.tnn.writer.core import Writer
from engine.formats.tnn.writer.registry import Rule, register, writes
from engine.ir import Node


def one_const(w: Writer, node: Node) -> tuple[int | None, list[str]]:
    """(index of the single constant operand or None, names of the listed operands)."""
    consts = [k for k, v in enumerate(node.inputs) if v.is_const]
    if len(consts) == 1 and len(node.inputs) == 2:
        return consts[0], [w.name(node.inputs[1 - consts[0]])]
    return None, [w.name(v) for v in node.inputs]


def binary(ltype: str) -> Rule:
    def run(w: Writer, node: Node) -> None:
        k, ins = one_const(w, node)
        out = [w.name(node.outputs[0])]
        if k is None:
            return w.layer(ltype, ins, out, [-1])
        data = np.asarray(node.inputs[k].const)
        if w.version == 1:
            _check_v1_element(w, node, data, node.inputs[1 - k])
        w.layer(ltype, ins, out, [k], [w.raw(data, False)])
    return run


def _check_v1_element(w: Writer, node: Node, data: np.ndarray, x) -> None:
    """v1 buffers keep no dims: the reader re-derives them from the element count; refuse if that differs."""
    shape = w.shape(x)
    placed = place_element(data.size, shape)
    out = np.broadcast_shapes(shape, data.shape)
    if placed is None or not np.array_equal(np.broadcast_to(data.reshape(placed), out), np.broadcast_to(data, out)):
        w.unsupported(f"with a constant of shape {data.shape} (not expressible in a v1 file)")


@writes("Pow")
def pow_(w: Writer, node: Node) -> None:
    exp = node.inputs[1]
    if not exp.is_const or np.asarray(exp.const).size != 1 or node.inputs[0].is_const:
        w.unsupported("with a non-scalar exponent")
    w.layer("Power", [w.name(node.inputs[0])], [w.name(node.outputs[0])], [float(np.asarray(exp.const)), 1.0, 0.0])


register({op: binary(t) for op, t in (("Add", "Add"), ("Sub", "Sub"), ("Mul", "Mul"), ("Div", "Div"),
                                     ("Maximum", "Maximum"), ("Minimum", "Minimum"))})
