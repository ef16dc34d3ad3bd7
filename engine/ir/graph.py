"""Graph, Node and Value: the one IR every loader builds and every pass rewrites.

A `Value` is a tensor edge (or, rarely, a host-side int list such as a shape). A value with `const` set
holds constant data (a weight shared between nodes, a folded constant); it has no producer.
A `Node` is one op application. Op-owned weights (a conv's filter) live in `Node.attrs`; scalars and
lists from the model file live in `Node.params`. `Graph.nodes` is kept in topological order.

Shapes are tuples of ints; -1 marks a dynamic dimension. `shape=None` means unknown (not yet inferred).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.errors import EngineError


@dataclass(eq=False)
class Value:
    name: str
    shape: tuple[int, ...] | None = None
    dtype: np.dtype | None = None
    const: np.ndarray | None = None
    producer: Node | None = None
    consumers: list[Node] = field(default_factory=list)

    @property
    def is_const(self) -> bool:
        return self.const is not None

    def __repr__(self) -> str:
        return f"Value({self.name!r}, {self.shape}, {self.dtype})"


@dataclass(eq=False)
class Node:
    op_type: str
    name: str
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    attrs: dict[str, np.ndarray] = field(default_factory=dict)
    # Where the node came from, for error messages: "model.pnnx.param:12".
    source: str = ""

    def __repr__(self) -> str:
        ins = ",".join(v.name for v in self.inputs)
        outs = ",".join(v.name for v in self.outputs)
        return f"Node({self.op_type} {self.name!r} [{ins}] -> [{outs}])"

    def where(self) -> str:
        return self.source or self.name


@dataclass(eq=False)
class Graph:
    nodes: list[Node] = field(default_factory=list)
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    path: str = ""
    # Free-form facts from the file (format name and version, producer) shown by `nnserve inspect`.
    meta: dict[str, Any] = field(default_factory=dict)
    _names: Iterable[int] = field(default_factory=itertools.count, repr=False)

    # -- construction -------------------------------------------------------------------------------
    def value(self, name: str | None = None, shape=None, dtype=None, const: np.ndarray | None = None) -> Value:
        """A new value. Constants get their shape and dtype from the data."""
        if const is not None:
            shape, dtype = tuple(const.shape), const.dtype
        return Value(name or self.fresh_name("v"), None if shape is None else tuple(shape),
                     None if dtype is None else np.dtype(dtype), const)

    def const(self, data, name: str | None = None) -> Value:
        return self.value(name or self.fresh_name("const"), const=np.asarray(data))

    def fresh_name(self, prefix: str) -> str:
        return f"{prefix}__{next(self._names)}"  # type: ignore[call-overload]

    def add_node(self, op_type: str, inputs: list[Value], outputs: list[Value] | int = 1, *,
                 name: str | None = None, params: dict | None = None, attrs: dict | None = None,
                 source: str = "", index: int | None = None) -> Node:
        """Appends (or inserts at `index`) a node and links producers and consumers."""
        if isinstance(outputs, int):
            outputs = [self.value() for _ in range(outputs)]
        node = Node(op_type, name or self.fresh_name(op_type.lower()), list(inputs), list(outputs),
                    dict(params or {}), dict(attrs or {}), source)
        for v in node.inputs:
            v.consumers.append(node)
        for v in node.outputs:
            v.producer = node
        if index is None:
            self.nodes.append(node)
        else:
            self.nodes.insert(index, node)
        return node

    # -- rewriting ----------------------------------------------------------------------------------
    def replace_uses(self, old: Value, new: Value) -> None:
        """Every consumer of `old` (and the graph outputs) now reads `new`. `consumers` has one entry per use."""
        for node in list(old.consumers):
            node.inputs = [new if v is old else v for v in node.inputs]
            new.consumers.append(node)
        old.consumers.clear()
        self.outputs = [new if v is old else v for v in self.outputs]

    def set_input(self, node: Node, index: int, value: Value) -> None:
        """Rewires one input of `node`. `consumers` holds one entry per use, so one entry moves."""
        node.inputs[index].consumers.remove(node)
        node.inputs[index] = value
        value.consumers.append(node)

    def remove_node(self, node: Node) -> None:
        """Unlinks a node and drops it from the node list (a scan of the list: a pass that removes many nodes
        unlinks each with `unlink` and drops them all at once with `drop_nodes`)."""
        self.unlink(node)
        self.nodes.remove(node)

    def unlink(self, node: Node) -> None:
        """Detaches a node from its values, leaving the node list alone. Its outputs must no longer be used."""
        for v in node.outputs:
            if v.consumers or v in self.outputs:
                raise EngineError(f"cannot remove {node}: output {v.name!r} is still used")
            v.producer = None
        drop_uses(node)

    def drop_nodes(self, gone: set[int]) -> None:
        """Drops the nodes whose id() is in `gone` from the node list, the others keeping their order."""
        if gone:
            self.nodes = [n for n in self.nodes if id(n) not in gone]

    def bypass(self, node: Node, keep_input: int = 0) -> None:
        """Removes a single-output node by wiring its output's users to one of its inputs."""
        self.replace_uses(node.outputs[0], node.inputs[keep_input])
        self.remove_node(node)

    def remove_dead(self) -> int:
        """Drops nodes none of whose outputs reach a graph output. Returns how many went."""
        live: set[int] = {id(v) for v in self.outputs}
        keep: list[Node] = []
        for node in reversed(self.nodes):
            if any(id(v) in live for v in node.outputs):
                keep.append(node)
                live.update(id(v) for v in node.inputs)
        kept = {id(n) for n in keep}  # by identity: a list membership test made this quadratic in the node count
        dead = [n for n in self.nodes if id(n) not in kept]
        gone = {id(n) for n in dead}
        # each consumer list filtered once: removing entries one at a time is quadratic in a value's fan-out
        for v in {id(v): v for n in dead for v in n.inputs}.values():
            v.consumers[:] = [c for c in v.consumers if id(c) not in gone]
        self.nodes = list(reversed(keep))
        return len(dead)

    # -- queries ------------------------------------------------------------------------------------
    def values(self) -> list[Value]:
        """Every value reachable from the node list, graph inputs first, each once."""
        seen: dict[int, Value] = {id(v): v for v in self.inputs}
        for node in self.nodes:
            for v in itertools.chain(node.inputs, node.outputs):
                seen.setdefault(id(v), v)
        return list(seen.values())

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def validate(self) -> None:
        """Checks topological order and link consistency; raises EngineError naming the first problem."""
        ready = {id(v) for v in self.inputs}
        listed: dict[int, set[int]] = {}  # id(value) -> ids of its consumers: `node in v.consumers` per use was
        for node in self.nodes:           # quadratic in a value's fan-out
            for v in node.inputs:
                if id(v) not in ready and not v.is_const:
                    raise EngineError(f"{node.where()}: input {v.name!r} of {node} is used before it is produced")
                ids = listed.get(id(v))
                if ids is None:
                    ids = listed[id(v)] = {id(c) for c in v.consumers}
                if id(node) not in ids:
                    raise EngineError(f"{node.where()}: {v.name!r} does not list {node.name!r} as consumer")
            for v in node.outputs:
                if v.producer is not node:
                    raise EngineError(f"{node.where()}: {v.name!r} has producer {v.producer!r}")
                ready.add(id(v))
        for v in self.outputs:
            if id(v) not in ready and not v.is_const:
                raise EngineError(f"graph output {v.name!r} is never produced")

    def toposort(self) -> None:
        """Re-orders nodes so producers come first (stable for an already sorted list)."""
        ready = {id(v) for v in self.inputs}
        pending, order = list(self.nodes), []
        while pending:
            progressed = False
            rest = []
            for node in pending:
                if all(v.is_const or id(v) in ready for v in node.inputs):
                    order.append(node)
                    ready.update(id(v) for v in node.outputs)
                    progressed = True
                else:
                    rest.append(node)
            if not progressed:
                raise EngineError(f"graph has a cycle or a missing producer at {rest[0]}")
            pending = rest
        self.nodes = order


def drop_uses(node: Node) -> None:
    """Removes `node` from the consumer lists of its inputs. A list holds one entry per use, so one removal per
    input: each stops at the entry, where `while node in v.consumers` scanned the whole list again, quadratic in the
    fan-out of a value read by thousands of nodes (a graph input every block adds back)."""
    for v in node.inputs:
        try:
            v.consumers.remove(node)
        except ValueError:  # already dropped (an edit that unlinked some uses first)
            pass
