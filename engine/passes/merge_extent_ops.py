"""merge_extent_ops: two nodes of an op whose output size depends on the data (NonZero, NonMaxSuppression) that
read the same values with the same params become one.

pnnx lowers every `x[mask]` to its own NonZero of the mask, so `boxes[keep] * scores[keep]` holds two. At run time
each data-dependent node reports its size on its own, and the runtime cannot check at load that two such sizes
agree (extents.py refuses a node that combines them); one node gives both operands the same size by construction.
These ops are pure functions of their inputs, so sharing the result changes no number.
"""

from __future__ import annotations

from engine.ir import Graph, Node
from engine.ops.registry import OPS


def merge_extent_ops(graph: Graph) -> Graph:
    seen: dict[tuple, Node] = {}
    gone: set[int] = set()  # dropped from the list at the end (one list.remove each was quadratic)
    for node in list(graph.nodes):
        op = OPS.get(node.op_type)
        if op is None or not op.extent_dims or node.attrs:
            continue
        key = (node.op_type, tuple(id(v) for v in node.inputs), repr(sorted(node.params.items())))
        first = seen.setdefault(key, node)
        if first is node or any(v in graph.outputs for v in node.outputs):
            continue  # a graph output keeps its own node: its name is the model's API
        for old, new in zip(node.outputs, first.outputs, strict=True):
            graph.replace_uses(old, new)
        graph.unlink(node)
        gone.add(id(node))
    graph.drop_nodes(gone)
    return graph
