"""fuse_epilogue: activations and residual adds folded into Conv and Gemm, checked against plain numpy."""

from __future__ import annotations

import numpy as np
import pytest
from np_ref import conv2d

from engine.ir import Graph
from engine.passes.fuse_epilogue import fuse_epilogue
from engine.runtime.model import Model

rng = np.random.default_rng(1)
W = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
B = rng.standard_normal(4).astype(np.float32)
CONV = {"stride": (1, 1), "pads": (1, 1, 1, 1), "dilation": (1, 1), "groups": 1}
X_SHAPE, Y_SHAPE = (2, 3, 5, 5), (2, 4, 5, 5)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


ACTS = [
    ("Relu", {}, lambda v: np.maximum(v, 0), "relu"),
    ("Clip", {"min": 0.0, "max": 6.0}, lambda v: np.clip(v, 0, 6), "relu6"),
    ("Clip", {"min": -0.5, "max": 0.5}, lambda v: np.clip(v, -0.5, 0.5), "clip"),
    ("LeakyRelu", {"alpha": 0.2}, lambda v: np.where(v < 0, 0.2 * v, v), "leaky_relu"),
    ("Sigmoid", {}, sigmoid, "sigmoid"),
    ("Silu", {}, lambda v: v * sigmoid(v), "silu"),
    ("HardSwish", {}, lambda v: v * np.clip(v / 6 + 0.5, 0, 1), "hardswish"),
    ("HardSigmoid", {"alpha": 0.2, "beta": 0.5}, lambda v: np.clip(0.2 * v + 0.5, 0, 1), "hardsigmoid"),
    ("Tanh", {}, np.tanh, "tanh"),
    ("Elu", {"alpha": 1.0}, lambda v: np.where(v < 0, np.expm1(v), v), "elu"),
]


def conv_graph(shape_known: bool = True):
    g = Graph()
    x = g.value("x", X_SHAPE, np.float32)
    g.inputs = [x]
    c = g.add_node("Conv", [x], name="conv", params=dict(CONV), attrs={"weight": W, "bias": B}).outputs[0]
    c.shape, c.dtype = (Y_SHAPE if shape_known else None), np.dtype(np.float32)
    return g, x, c


def finish(g: Graph, y, name="y"):
    y.name = name
    g.outputs = [y]
    return g


def run(g: Graph, **feeds) -> np.ndarray:
    return Model(g, "test").instance().run(feeds)["y"]


@pytest.mark.parametrize("op,params,fn,name", ACTS, ids=[a[3] for a in ACTS])
def test_activation_fused_into_conv(op, params, fn, name):
    g, x, c = conv_graph()
    finish(g, g.add_node(op, [c], params=params).outputs[0])
    fuse_epilogue(g)
    g.validate()
    (conv,) = g.nodes
    assert conv.params["activation"] == name and conv.outputs[0].name == "y"
    xv = rng.standard_normal(X_SHAPE).astype(np.float32)
    np.testing.assert_allclose(run(g, x=xv), fn(conv2d(xv, W, B, pad=1)), rtol=1e-4, atol=1e-4)


def test_residual_add_then_relu():
    g, x, c = conv_graph()
    z = g.value("z", Y_SHAPE, np.float32)
    g.inputs.append(z)
    s = g.add_node("Add", [z, c]).outputs[0]  # residual on the left is fine too
    s.shape = Y_SHAPE
    finish(g, g.add_node("Relu", [s]).outputs[0])
    fuse_epilogue(g)
    g.validate()
    (conv,) = g.nodes
    assert conv.inputs[1] is z and conv.params["activation"] == "relu"
    xv = rng.standard_normal(X_SHAPE).astype(np.float32)
    zv = rng.standard_normal(Y_SHAPE).astype(np.float32)
    want = np.maximum(conv2d(xv, W, B, pad=1) + zv, 0)
    np.testing.assert_allclose(run(g, x=xv, z=zv), want, rtol=1e-4, atol=1e-4)


def test_residual_produced_after_the_conv_moves_the_conv_down():
    g, x, c = conv_graph()
    # z is computed from x after the conv in node order: the fused conv must run after it.
    zc = g.add_node("Conv", [x], name="side", params=dict(CONV), attrs={"weight": W}).outputs[0]
    zc.shape, zc.dtype = Y_SHAPE, np.dtype(np.float32)
    s = g.add_node("Add", [c, zc]).outputs[0]
    s.shape = Y_SHAPE
    finish(g, s)
    fuse_epilogue(g)
    g.validate()
    assert [n.name for n in g.nodes] == ["side", "conv"]
    xv = rng.standard_normal(X_SHAPE).astype(np.float32)
    want = conv2d(xv, W, B, pad=1) + conv2d(xv, W, None, pad=1)
    np.testing.assert_allclose(run(g, x=xv), want, rtol=1e-4, atol=1e-4)


def test_no_fusion_when_intermediate_is_shared_or_an_output():
    g, x, c = conv_graph()
    a = g.add_node("Relu", [c]).outputs[0]
    b = g.add_node("Sigmoid", [c]).outputs[0]
    g.outputs = [a, b]
    fuse_epilogue(g)
    assert [n.op_type for n in g.nodes] == ["Conv", "Relu", "Sigmoid"]
    g, x, c = conv_graph()
    r = g.add_node("Relu", [c]).outputs[0]
    g.outputs = [c, r]
    fuse_epilogue(g)
    assert [n.op_type for n in g.nodes] == ["Conv", "Relu"]


def test_no_residual_after_activation_or_for_broadcasting_add():
    g, x, c = conv_graph()
    r = g.add_node("Relu", [c]).outputs[0]
    r.shape = Y_SHAPE
    one = g.const(np.ones((1, 4, 1, 1), np.float32))
    finish(g, g.add_node("Add", [r, one]).outputs[0])
    fuse_epilogue(g)
    assert [n.op_type for n in g.nodes] == ["Conv", "Add"]  # relu fused, the broadcasting add kept
    assert len(g.nodes[0].inputs) == 1
    g, x, c = conv_graph(shape_known=False)
    z = g.value("z", Y_SHAPE, np.float32)
    g.inputs.append(z)
    finish(g, g.add_node("Add", [c, z]).outputs[0])
    fuse_epilogue(g)
    assert [n.op_type for n in g.nodes] == ["Conv", "Add"]  # unknown shape: not provably same-shape


def gemm_graph(x_shape=(2, 5, 6), n=4):
    g = Graph()
    x = g.value("x", x_shape, np.float32)
    z = g.value("z", x_shape[:-1] + (n,), np.float32)
    g.inputs = [x, z]
    w, b = rng.standard_normal((n, x_shape[-1])).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    y = g.add_node("Gemm", [x], name="proj", params={"activation": None, "activation_params": {}},
                   attrs={"weight": w, "bias": b}).outputs[0]
    y.shape, y.dtype = x_shape[:-1] + (n,), np.dtype(np.float32)
    return g, x, z, y, w, b


@pytest.mark.parametrize("left", [True, False])
def test_transformer_residual_fused_into_gemm(left):
    g, x, z, y, w, b = gemm_graph()
    s = g.add_node("Add", [z, y] if left else [y, z]).outputs[0]
    s.shape = y.shape
    finish(g, s)
    fuse_epilogue(g)
    g.validate()
    (gemm,) = g.nodes
    assert gemm.op_type == "Gemm" and gemm.inputs == [x, z] and gemm.outputs[0].name == "y"
    xv, zv = (rng.standard_normal(v.shape).astype(np.float32) for v in (x, z))
    np.testing.assert_allclose(run(g, x=xv, z=zv), xv @ w.T + b + zv, rtol=1e-4, atol=1e-4)


def test_gemm_residual_then_activation():
    g, x, z, y, w, b = gemm_graph()
    s = g.add_node("Add", [y, z]).outputs[0]
    s.shape = y.shape
    finish(g, g.add_node("Relu", [s]).outputs[0])
    fuse_epilogue(g)
    (gemm,) = g.nodes
    assert gemm.params["activation"] == "relu" and len(gemm.inputs) == 2
    xv, zv = (rng.standard_normal(v.shape).astype(np.float32) for v in (x, z))
    np.testing.assert_allclose(run(g, x=xv, z=zv), np.maximum(xv @ w.T + b + zv, 0), rtol=1e-4, atol=1e-4)


def test_no_gemm_residual_after_its_activation():
    g, x, z, y, w, b = gemm_graph()
    r = g.add_node("Gelu", [y], params={"approximate": "none"}).outputs[0]
    r.shape = y.shape
    s = g.add_node("Add", [r, z]).outputs[0]
    s.shape = y.shape
    finish(g, s)
    fuse_epilogue(g)
    assert [n.op_type for n in g.nodes] == ["Gemm", "Add"] and g.nodes[0].params["activation"] == "gelu"
