"""fold_constants: all-constant subgraphs become constant values; results match plain numpy."""

from __future__ import annotations

import numpy as np

from engine.ir import Graph
from engine.passes.fold_constants import fold_constants
from engine.runtime.model import Model


def test_constant_chain_folds_and_result_is_unchanged():
    g = Graph()
    x = g.value("x", (2, 3), np.float32)
    g.inputs = [x]
    a = g.const(np.array([1.0, 2.0, 3.0], np.float32))
    b = g.const(np.array([0.5, 0.5, 0.5], np.float32))
    s = g.add_node("Add", [a, b], name="fold_me").outputs[0]
    e = g.add_node("Exp", [s], name="and_me").outputs[0]
    y = g.add_node("Mul", [x, e], name="keep").outputs[0]
    y.name = "y"
    g.outputs = [y]
    fold_constants(g)
    g.validate()
    assert [n.name for n in g.nodes] == ["keep"]
    assert g.nodes[0].inputs[1].is_const
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = Model(g, "t").instance().run({"x": xv})["y"]
    np.testing.assert_allclose(out, xv * np.exp(np.array([1.5, 2.5, 3.5], np.float32)), rtol=1e-6)


def test_constant_graph_output_keeps_its_name():
    g = Graph()
    x = g.value("x", (2,), np.float32)
    g.inputs = [x]
    c = g.add_node("Neg", [g.const(np.array([1.0, -2.0], np.float32))]).outputs[0]
    c.name = "c"
    y = g.add_node("Relu", [x]).outputs[0]
    y.name = "y"
    g.outputs = [c, y]
    fold_constants(g)
    g.validate()
    assert g.outputs[0].name == "c" and g.outputs[0].is_const
    out = Model(g, "t").instance().run({"x": np.array([-1.0, 1.0], np.float32)})
    np.testing.assert_array_equal(out["c"], [-1.0, 2.0])
    np.testing.assert_array_equal(out["y"], [0.0, 1.0])


def test_nodes_reading_runtime_values_or_blowing_up_weights_are_kept():
    g = Graph()
    x = g.value("x", (4,), np.float32)
    g.inputs = [x]
    big = g.add_node("Expand", [g.const(np.float32(1.0))], params={"shape": [1024, 1024]}).outputs[0]
    y = g.add_node("Add", [x, g.const(np.ones(4, np.float32))]).outputs[0]
    g.outputs = [big, y]
    fold_constants(g)
    assert [n.op_type for n in g.nodes] == ["Expand", "Add"]


def test_unknown_ops_are_left_alone():
    g = Graph()
    x = g.value("x", (1,), np.float32)
    g.inputs = [x]
    u = g.add_node("pnnx:Unknown", [g.const(np.ones(1, np.float32))]).outputs[0]
    g.outputs = [u]
    fold_constants(g)
    assert [n.op_type for n in g.nodes] == ["pnnx:Unknown"]
