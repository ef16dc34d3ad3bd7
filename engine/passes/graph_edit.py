"""Graph queries and edits the rewrite passes share: a node's OpDef, a value's single consumer, static shapes,
one node taking over another's output, node list edits applied in one pass (NodeEdits), and a copy of a graph for
a rewrite that must not edit its input."""

from __future__ import annotations

from engine.ir import Graph, Node, Value, drop_uses
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


class NodeEdits:
    """The node list edits a pass makes while it walks `graph.nodes` (a node removed, one moved to another's place,
    one inserted before another), applied to the list in one pass by `apply`. Made with list.remove / index / insert
    at each edit, one scan of the list each, they made a pass quadratic in the node count.

    Each node of the list as it was when the edits began is a slot; a slot holds the nodes now at its position, in
    order (the node itself until an edit changes that)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.start = len(graph.nodes)
        self.slots: dict[int, list[Node]] = {}  # id of a slot's first node -> the nodes there now
        self.home: dict[int, int] = {}  # id(node) -> its slot, for a node an edit placed

    def _slot(self, node: Node) -> list[Node]:
        key = self.home.get(id(node), id(node))
        return self.slots.setdefault(key, [node])

    def contains(self, node: Node) -> bool:
        """Whether `node` (a node of the list, or one placed by an edit) is still in the graph."""
        key = self.home.get(id(node), id(node))
        return node in self.slots.get(key, (node,))

    def remove(self, node: Node) -> None:
        """Takes `node` out of the list (unlinking it is the caller's: Graph.unlink)."""
        self._slot(node).remove(node)
        self.home.pop(id(node), None)
        # its own slot now says it is gone (an appended node without a slot would count as still there)
        self.slots.setdefault(id(node), [])

    def insert_before(self, new: Node, anchor: Node) -> None:
        """Places `new` (made with Graph.add_node, which appended it) just before `anchor`."""
        slot = self._slot(anchor)
        slot.insert(slot.index(anchor), new)
        self.home[id(new)] = self.home.get(id(anchor), id(anchor))

    def take_place(self, node: Node, of: Node) -> None:
        """`node` leaves its position for `of`'s, and `of` leaves the list."""
        self.remove(node)
        slot = self._slot(of)
        slot[slot.index(of)] = node
        self.home[id(node)] = self.home.pop(id(of), id(of))

    def apply(self) -> None:
        """Writes the edits into graph.nodes (nodes appended since the edits began stay last, unless placed)."""
        nodes = self.graph.nodes
        # an appended node no edit placed keeps its own slot: itself (unless removed) and what was inserted before it
        placed = [m for n in nodes[self.start:] if id(n) not in self.home for m in self.slots.get(id(n), (n,))]
        self.graph.nodes = [n for old in nodes[: self.start] for n in self.slots.get(id(old), (old,))] + placed


def absorb_output(graph: Graph, anchor: Node, follower: Node, edits: NodeEdits) -> None:
    """`anchor` takes over `follower`'s output value (name kept) and `follower` leaves the graph.

    `anchor` moves to `follower`'s position so inputs `follower` read from later nodes are ready (in `edits`, which
    the pass applies once at its end).
    """
    old = anchor.outputs[0]
    new = follower.outputs[0]
    drop_uses(follower)
    edits.take_place(anchor, follower)
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
