"""NodeEdits (engine/passes/graph_edit.py): the node list edits a pass records, applied once, give the list that
list.remove / insert / index at each edit would have given."""

from __future__ import annotations

from engine.ir import Graph
from engine.passes.graph_edit import NodeEdits


def chain() -> tuple[Graph, object, object, object]:
    g = Graph()
    x = g.value("x", (1,), "float32")
    g.inputs = [x]
    a = g.add_node("Relu", [x], 1, name="a")
    b = g.add_node("Relu", [a.outputs[0]], 1, name="b")
    g.outputs = [b.outputs[0]]
    return g, x, a, b


def names(g: Graph) -> list[str]:
    return [n.name for n in g.nodes]


def test_an_inserted_node_removed_again_is_gone():
    g, x, a, b = chain()
    edits = NodeEdits(g)
    t = g.add_node("Neg", [x], 1, name="t")
    edits.insert_before(t, b)
    g.unlink(t)
    edits.remove(t)
    assert not edits.contains(t)
    edits.apply()
    assert names(g) == ["a", "b"]


def test_an_appended_node_removed_is_gone():
    g, x, a, b = chain()
    edits = NodeEdits(g)
    t = g.add_node("Neg", [x], 1, name="t")
    edits.remove(t)
    edits.apply()
    assert names(g) == ["a", "b"]


def test_a_node_inserted_before_an_appended_one_is_kept_before_it():
    g, x, a, b = chain()
    edits = NodeEdits(g)
    n1 = g.add_node("Neg", [x], 1, name="n1")
    n2 = g.add_node("Neg", [x], 1, name="n2")
    edits.insert_before(n2, n1)
    edits.apply()
    assert names(g) == ["a", "b", "n2", "n1"]


def test_moves_removals_and_insertions_together():
    g, x, a, b = chain()
    c = g.add_node("Relu", [b.outputs[0]], 1, name="c")
    edits = NodeEdits(g)
    edits.remove(a)
    edits.insert_before(a, c)  # removed, then placed again elsewhere
    t = g.add_node("Neg", [x], 1, name="t")
    edits.insert_before(t, b)
    edits.take_place(b, c)  # b moves to c's place, c leaves
    edits.apply()
    assert names(g) == ["t", "a", "b"]
