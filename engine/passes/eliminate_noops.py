"""eliminate_noops: drops nodes whose output equals their input 0 (Identity, Dropout, a reshape to the same
static shape, a single-input Concat, a full Slice, a Cast to the same dtype, an identity Transpose, ...)."""

from __future__ import annotations

import numpy as np

from engine.ir import Graph, Node
from engine.passes.graph_edit import is_static

_ALWAYS = {"Identity", "Dropout"}
_SAME_SHAPE = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand"}
_END = 2**31 - 1


def eliminate_noops(graph: Graph) -> Graph:
    gone: set[int] = set()  # dropped from the list at the end (one list.remove each was quadratic)
    for node in list(graph.nodes):
        if node.inputs and len(node.outputs) == 1 and is_noop(node) and _drop(graph, node):
            gone.add(id(node))
    graph.drop_nodes(gone)
    return graph


def is_noop(node: Node) -> bool:
    t, p = node.op_type, node.params
    x, y = node.inputs[0], node.outputs[0]
    if t in _ALWAYS:
        return True
    if t in _SAME_SHAPE:
        return is_static(x.shape) and x.shape == y.shape
    if t == "Concat":
        return len(node.inputs) == 1
    if t == "Cast":
        return x.dtype is not None and np.dtype(p.get("to", x.dtype)) == x.dtype
    if t == "Transpose":
        return list(p.get("perm", [0])) == list(range(len(p.get("perm", [0]))))
    if t == "Tile":
        return all(r == 1 for r in p.get("repeats", [2]))
    if t == "Pad":
        return p.get("mode", "constant") == "constant" and not any(p.get("pads", [1]))
    if t == "Slice":
        return _full_slice(node)
    return False


def _full_slice(node: Node) -> bool:
    p, shape = node.params, node.inputs[0].shape
    starts, ends = p.get("starts", []), p.get("ends", [])
    axes = p.get("axes") or list(range(len(starts)))
    steps = p.get("steps") or [1] * len(starts)
    if not starts or len(ends) != len(starts) or len(axes) != len(starts):
        return False
    for s, e, a, st in zip(starts, ends, axes, steps, strict=False):
        dim = shape[a] if shape is not None and -len(shape) <= a < len(shape) else -1
        if s != 0 or st != 1 or not (e >= _END or (dim >= 0 and e >= dim)):
            return False
    return True


def _drop(graph: Graph, node: Node) -> bool:
    """Wires the node's readers to its input and unlinks it (Graph.bypass without the list edit); False where it
    stays."""
    x, y = node.inputs[0], node.outputs[0]
    if y in graph.outputs:
        # The output's name is the model's API: keep it by renaming the input, when that is safe.
        if x.is_const or x in graph.inputs or x in graph.outputs:
            return False
        x.name = y.name
    graph.replace_uses(y, x)
    graph.unlink(node)
    return True
