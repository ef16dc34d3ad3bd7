"""Graph queries and edits the rewrite passes share: a node's OpDef, a value's single consumer, static shapes,
one node taking over another's output, and a copy of a graph for a rewrite that must not edit its input."""

from __future__ import annotations

from engine.ir import Graph, Node, Value
from engine.ops.registry import OpDef, all_ops


def op_of(node: Node) -> OpDef | None:
    """The node's OpDef, or None for an op the registry does not know (passes leave those alone)."""
    return all_ops().get(node.op_type)


def single_consumer(graph: Graph, v: Value) -> Node | None:
    """The only node reading `v` once, when `v` is not a graph output; else None."""
    if v in graph.outputs or len(v.consumers) != 1:
        return None
    return v.consumers[0]


def is_static(shape) -> bool:
    return shape is not None and all(d is not None and d >= 0 for d in shape)


def absorb_output(graph: Graph, anchor: Node, follower: Node) -> None:
    """`anchor` takes over `follower`'s output value (name kept) and `follower` leaves the graph.

    `anchor` moves to `follower`'s position so inputs `follower` read from later nodes are ready.
    """
    old = anchor.outputs[0]
    new = follower.outputs[0]
    for v in follower.inputs:
        while follower in v.consumers:
            v.consumers.remove(follower)
    graph.nodes.remove(anchor)
    graph.nodes[graph.nodes.index(follower)] = anchor
    anchor.outputs[0] = new
    new.producer = anchor
    old.producer = None


def copy_graph(graph: Graph) -> Graph:
    """Values and nodes new (params copied), weight arrays and constants shared."""
    new = Graph(path=graph.path, meta=dict(graph.meta), _names=graph._names)
    values: dict[int, Value] = {}

    def value(v: Value) -> Value:
        c = values.get(id(v))
        if c is None:
            c = values[id(v)] = Value(v.name, v.shape, v.dtype, v.const)
        return c

    new.inputs = [value(v) for v in graph.inputs]
    for n in graph.nodes:
        new.add_node(n.op_type, [value(v) for v in n.inputs], [value(v) for v in n.outputs], name=n.name,
                     params=dict(n.params), attrs=n.attrs, source=n.source)
    new.outputs = [value(v) for v in graph.outputs]
    return new


def rewrite_on_copy(graph: Graph, op_type: str, match, rewrite) -> tuple[Graph, int]:
    """(a copy of `graph` with rewrite(copy, node, found) applied to each `op_type` node that match(copy, node)
    finds, the count), or (`graph` itself, 0) when none matches: `graph` may be a Model's, shared by its instances,
    so it is never edited."""
    if not any(match(graph, n) for n in graph.nodes if n.op_type == op_type):
        return graph, 0
    new = copy_graph(graph)
    count = 0
    for node in list(new.nodes):
        found = match(new, node) if node.op_type == op_type else None
        if found is not None:
            rewrite(new, node, found)
            count += 1
    return new, count
