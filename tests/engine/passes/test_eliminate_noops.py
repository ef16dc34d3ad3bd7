"""eliminate_noops: no-op nodes go, output names stay, real reshapes stay; results match numpy."""

from __future__ import annotations

import numpy as np
import pytest

from engine.ir import Graph
from engine.passes.eliminate_noops import eliminate_noops
from engine.runtime.model import Model

NOOPS = [
    ("Identity", {}),
    ("Dropout", {}),
    ("Reshape", {"shape": [2, 3]}),
    ("Flatten", {"start_dim": 1, "end_dim": -1}),
    ("Cast", {"to": "float32"}),
    ("Transpose", {"perm": [0, 1]}),
    ("Slice", {"starts": [0], "ends": [2**31 - 1], "axes": [1], "steps": [1]}),
    ("Slice", {"starts": [0, 0], "ends": [2, 3], "axes": [0, 1]}),
    ("Concat", {"axis": 0}),
    ("Tile", {"repeats": [1, 1]}),
    ("Pad", {"pads": [0, 0, 0, 0], "mode": "constant"}),
]


def chain(op: str, params: dict, out_shape=(2, 3)) -> Graph:
    """x -> Relu -> op -> Neg -> y"""
    g = Graph()
    x = g.value("x", (2, 3), np.float32)
    g.inputs = [x]
    r = g.add_node("Relu", [x]).outputs[0]
    r.shape, r.dtype = (2, 3), np.dtype(np.float32)
    m = g.add_node(op, [r], params=params).outputs[0]
    m.shape, m.dtype = out_shape, np.dtype(np.float32)
    y = g.add_node("Neg", [m]).outputs[0]
    y.name = "y"
    g.outputs = [y]
    return g


@pytest.mark.parametrize("op,params", NOOPS, ids=[f"{o}{i}" for i, (o, _) in enumerate(NOOPS)])
def test_noop_removed(op, params):
    g = chain(op, params)
    eliminate_noops(g)
    g.validate()
    assert [n.op_type for n in g.nodes] == ["Relu", "Neg"]
    x = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)
    np.testing.assert_array_equal(Model(g, "t").instance().run({"x": x})["y"], -np.maximum(x, 0))


@pytest.mark.parametrize("op,params,shape", [
    ("Reshape", {"shape": [3, 2]}, (3, 2)),
    ("Transpose", {"perm": [1, 0]}, (3, 2)),
    ("Slice", {"starts": [1], "ends": [3], "axes": [1]}, (2, 2)),
    ("Cast", {"to": "float16"}, (2, 3)),
])
def test_real_ops_kept(op, params, shape):
    g = chain(op, params, shape)
    eliminate_noops(g)
    assert [n.op_type for n in g.nodes] == ["Relu", op, "Neg"]


def test_noop_producing_a_graph_output_keeps_the_output_name():
    g = Graph()
    x = g.value("x", (2, 3), np.float32)
    g.inputs = [x]
    r = g.add_node("Relu", [x]).outputs[0]
    y = g.add_node("Identity", [r]).outputs[0]
    y.name = "y"
    g.outputs = [y]
    eliminate_noops(g)
    g.validate()
    assert [n.op_type for n in g.nodes] == ["Relu"] and g.outputs[0].name == "y"


def test_identity_between_graph_input_and_output_stays():
    g = Graph()
    x = g.value("x", (2,), np.float32)
    g.inputs = [x]
    y = g.add_node("Identity", [x]).outputs[0]
    y.name = "y"
    g.outputs = [y]
    eliminate_noops(g)
    assert len(g.nodes) == 1
    out = Model(g, "t").instance().run({"x": np.array([1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(out["y"], [1.0, 2.0])
