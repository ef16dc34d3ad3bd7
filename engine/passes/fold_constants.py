"""fold_constants: a node whose inputs are all constants becomes constant values (its numpy reference, once).

The op's shape inference runs first, so a node its op refuses (integer math on a float operand, indices of the
wrong dtype) is an error at load, as it would be with run-time inputs, never a folded wrong constant."""

from __future__ import annotations

import numpy as np

from engine.ir import Graph, Node
from engine.ops.rules import elements
from engine.passes.graph_edit import op_of
from engine.passes.infer_shapes import const_info, infer_node

# Folding must not blow weights up: an Expand of a scalar to a huge tensor stays a node.
MAX_GROWTH = 4
MAX_UNCHECKED_BYTES = 1 << 20


def fold_constants(graph: Graph) -> Graph:
    for node in list(graph.nodes):
        if node.inputs and all(v.is_const for v in node.inputs):
            _fold(graph, node)
    return graph


def _fold(graph: Graph, node: Node) -> None:
    op = op_of(node)
    if op is None:
        return
    outs = infer_node(node, [const_info(v) for v in node.inputs])
    in_bytes = sum(v.const.nbytes for v in node.inputs) + sum(getattr(a, "nbytes", 0) for a in node.attrs.values())
    if _too_big(sum(elements(o.shape) * o.dtype.itemsize for o in outs), in_bytes):
        return  # decided from the inferred shapes, before anything of that size is allocated
    try:
        results = [np.asarray(r) for r in op.reference(node, [v.const for v in node.inputs])]
    except Exception:  # leave it to run-time, where a failure gets a proper KernelError
        return
    if _too_big(sum(r.nbytes for r in results), in_bytes):
        return
    if len(results) != len(node.outputs):
        return
    for v, r in zip(node.outputs, results, strict=True):
        v.const, v.shape, v.dtype, v.producer = r, tuple(r.shape), r.dtype, None
    for v in node.inputs:
        while node in v.consumers:
            v.consumers.remove(node)
    graph.nodes.remove(node)


def _too_big(out_bytes: int, in_bytes: int) -> bool:
    return out_bytes > MAX_UNCHECKED_BYTES and out_bytes > MAX_GROWTH * in_bytes
