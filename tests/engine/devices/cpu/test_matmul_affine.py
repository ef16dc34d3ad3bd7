"""MatMulAffine: the CPU device fuses a MatMul's scalar scale and constant offset after it (EfficientFormer's
attention scores with their bias) into one node that matches numpy; other chains stay as they are (and match)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.devices.cpu.matmul_affine import fuse_matmul_affine
from engine.ir import Graph
from engine.passes.infer_shapes import infer_shapes
from engine.runtime.model import Model

RNG = np.random.default_rng(11)


def affine_graph(scale=0.25, bias_shape=(8, 5, 6), scale_shape=(), expose=False, dynamic_bias=False):
    """y = (a @ b) [* scale] [+ bias] on a (2, 8, 5, 4), b (2, 8, 4, 6)."""
    g = Graph()
    a = g.value("a", (2, 8, 5, 4), np.float32)
    b = g.value("b", (2, 8, 4, 6), np.float32)
    g.inputs = [a, b]
    y = g.add_node("MatMul", [a, b], name="mm").outputs[0]
    mm_out = y
    if scale is not None:
        y = g.add_node("Mul", [y, g.const(np.full(scale_shape, scale, np.float32))]).outputs[0]
    if bias_shape is not None:
        if dynamic_bias:
            c = g.value("c", bias_shape, np.float32)
            g.inputs.append(c)
        else:
            c = g.const(RNG.standard_normal(bias_shape).astype(np.float32))
        y = g.add_node("Add", [c, y]).outputs[0]
    y.name = "y"
    g.outputs = [y, mm_out] if expose else [y]
    return infer_shapes(g)


def feeds(g: Graph) -> dict[str, np.ndarray]:
    return {v.name: RNG.standard_normal(v.shape).astype(np.float32) for v in g.inputs}


def want(g: Graph, f: dict[str, np.ndarray]) -> np.ndarray:
    """numpy on the graph as built: every node's meaning written out."""
    vals = dict(f)
    for n in g.nodes:
        x = [v.const if v.is_const else vals[v.name] for v in n.inputs]
        vals[n.outputs[0].name] = {"MatMul": np.matmul, "Mul": np.multiply, "Add": np.add}[n.op_type](*x)
    return vals["y"]


def run(g: Graph, f):
    inst = Model(g, "test").instance()
    return inst, inst.run(f)["y"]


@pytest.mark.parametrize("scale,bias_shape", [(0.25, (8, 5, 6)), (None, (1, 6)), (0.5, None), (-2.0, ())])
def test_scale_and_offset_fuse_and_match_numpy(scale, bias_shape):
    g = affine_graph(scale, bias_shape)
    f = feeds(g)
    inst, got = run(g, f)
    assert [n.op_type for n in inst.graph.nodes] == ["MatMulAffine"]
    assert [n.op_type for n in g.nodes][0] == "MatMul"  # the model's graph is not edited
    np.testing.assert_allclose(got, want(g, f), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("knob", [
    {"scale_shape": (6,)},  # a scale per column is not a scalar
    {"expose": True},  # the product is also a graph output
    {"scale": None, "bias_shape": (3, 2, 8, 5, 6)},  # the offset grows the output
    {"scale": None, "dynamic_bias": True},  # an offset known only at run time
])
def test_other_chains_stay(knob):
    g = affine_graph(**knob)
    assert fuse_matmul_affine(g) is g
    f = feeds(g)
    inst, got = run(g, f)
    assert "MatMulAffine" not in [n.op_type for n in inst.graph.nodes]
    np.testing.assert_allclose(got, want(g, f), rtol=1e-5, atol=1e-5)


def test_a_scale_alone_fuses_when_the_offset_cannot():
    g = affine_graph(0.3, (8, 5, 6), dynamic_bias=True)
    f = feeds(g)
    inst, got = run(g, f)
    assert [n.op_type for n in inst.graph.nodes] == ["MatMulAffine", "Add"]
    np.testing.assert_allclose(got, want(g, f), rtol=1e-5, atol=1e-5)
