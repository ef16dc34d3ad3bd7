"""fold_constants: a node whose inputs are all constants becomes constant values (its numpy reference, once).

The op's shape inference runs first, so a node its op refuses (integer math on a float operand, indices of the
wrong dtype) is an error at load, as it would be with run-time inputs, never a folded wrong constant."""

from __future__ import annotations

import numpy as np

from engine.ir import Graph, Node, drop_uses
from engine.ops.rules import elements
from engine.passes.graph_edit import op_of
from engine.passes.infer_shapes import const_info, infer_node

# Folding must not blow weights up: an Expand of a scalar to a huge tensor stays a node.
MAX_GROWTH = 4
MAX_UNCHECKED_BYTES = 1 << 20


def fold_constants(graph: Graph) -> Graph:
    gone: set[int] = set()  # folded nodes, dropped from the list at the end (one list.remove each was quadratic)
    for node in list(graph.nodes):
        if node.inputs and all(v.is_const for v in node.inputs) and _fold(node):
            gone.add(id(node))
    graph.drop_nodes(gone)
    return graph


def _fold(node: Node) -> bool:
    """Makes the node's outputs constants and unlinks it; False where it stays a node."""
    op = op_of(node)
    if op is None:
        return False
    outs = infer_node(node, [const_info(v) for v in node.inputs])
    in_bytes = sum(v.const.nbytes for v in node.inputs) + sum(getattr(a, "nbytes", 0) for a in node.attrs.values())
    if _too_big(sum(elements(o.shape) * o.dtype.itemsize for o in outs), in_bytes):
        return False  # decided from the inferred shapes, before anything of that size is allocated
    try:
        results = [np.asarray(r) for r in op.reference(node, [v.const for v in node.inputs])]
    except Exception:  # leave it to run-time, where a failure gets a proper KernelError
        return False
    if _too_big(sum(r.nbytes for r in results), in_bytes):
        return False
    if len(results) != len(node.outputs):
        return False
    for v, r in zip(node.outputs, results, strict=True):
        v.const, v.shape, v.dtype, v.producer = r, tuple(r.shape), r.dtype, None
    drop_uses(node)
    return True


def _too_big(out_bytes: int, in_bytes: int) -> bool:
    return out_bytes > MAX_UNCHECKED_BYTES and out_bytes > MAX_GROWTH * in_bytes
