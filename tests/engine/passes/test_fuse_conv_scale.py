"""fuse_conv_scale: a per-channel constant Mul after a Conv folds into its weights, and gives what conv-then-mul
gives in plain numpy; anything that is not one factor per output channel stays a Mul."""

from __future__ import annotations

import numpy as np
import pytest
from np_ref import conv2d

from engine.ir import Graph
from engine.passes.fuse_conv_scale import fuse_conv_scale
from engine.passes.infer_shapes import infer_shapes
from engine.passes.pipeline import run_pipeline
from engine.runtime.model import Model

rng = np.random.default_rng(0)
PARAMS = {"stride": (1, 1), "pads": (1, 1, 1, 1), "dilation": (1, 1), "groups": 1}


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def conv_mul_graph(weight, bias, gamma, x_shape, gamma_first=False, params=PARAMS, residual=False):
    """y = conv(x) * gamma (+ x when residual)."""
    g = Graph()
    x = g.value("x", x_shape, np.float32)
    g.inputs = [x]
    attrs = {"weight": weight} if bias is None else {"weight": weight, "bias": bias}
    c = g.add_node("Conv", [x], name="conv", params=dict(params), attrs=attrs).outputs[0]
    k = g.const(gamma)
    y = g.add_node("Mul", [k, c] if gamma_first else [c, k], name="mul").outputs[0]
    if residual:
        y = g.add_node("Add", [x, y], name="add").outputs[0]
    y.name = "y"
    g.outputs = [y]
    return infer_shapes(g)


def run(g: Graph, x: np.ndarray) -> np.ndarray:
    return Model(g, "test").instance().run({"x": x})["y"]


@pytest.mark.parametrize("gamma_shape", [(1, 6, 1, 1), (6, 1, 1), (1,), ()])
@pytest.mark.parametrize("gamma_first", [False, True])
def test_channel_scale_folds_into_conv(gamma_shape, gamma_first):
    w, b = rand(6, 4, 3, 3), rand(6)
    gamma = rand(*gamma_shape)
    g = conv_mul_graph(w, b, gamma, (2, 4, 5, 5), gamma_first)
    fuse_conv_scale(g)
    g.validate()
    assert [n.op_type for n in g.nodes] == ["Conv"] and g.outputs[0].name == "y"
    x = rand(2, 4, 5, 5)
    want = conv2d(x, w, b, pad=1) * gamma
    np.testing.assert_allclose(run(g, x), want, rtol=1e-4, atol=1e-4)


def test_grouped_conv_without_bias():
    w, gamma = rand(6, 1, 3, 3), rand(1, 6, 1, 1)
    params = dict(PARAMS, groups=6)
    g = conv_mul_graph(w, None, gamma, (1, 6, 5, 5), params=params)
    fuse_conv_scale(g)
    assert [n.op_type for n in g.nodes] == ["Conv"]
    x = rand(1, 6, 5, 5)
    np.testing.assert_allclose(run(g, x), conv2d(x, w, None, pad=1, groups=6) * gamma, rtol=1e-4, atol=1e-4)


def test_pipeline_turns_layer_scale_residual_into_one_conv():
    w, b, gamma = rand(4, 4, 3, 3), rand(4), rand(1, 4, 1, 1)
    g = conv_mul_graph(w, b, gamma, (1, 4, 6, 6), residual=True)
    run_pipeline(g)
    assert [n.op_type for n in g.nodes] == ["Conv"] and len(g.nodes[0].inputs) == 2
    x = rand(1, 4, 6, 6)
    np.testing.assert_allclose(run(g, x), x + conv2d(x, w, b, pad=1) * gamma, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("gamma_shape", [
    (1, 1, 5, 5),  # one factor per position, not per channel
    (1, 1, 1, 5),  # along the width
    (5,),  # (5,) broadcasts along the last axis, not the channels
    (2, 6, 1, 1),  # one factor per sample
    (1, 1, 6, 1, 1),  # grows the output's rank
])
def test_refuses_what_is_not_one_factor_per_channel(gamma_shape):
    w = rand(6, 4, 3, 3)
    gamma = rand(*gamma_shape)
    g = conv_mul_graph(w, None, gamma, (2, 4, 5, 5))
    fuse_conv_scale(g)
    assert [n.op_type for n in g.nodes] == ["Conv", "Mul"]
    x = rand(2, 4, 5, 5)
    np.testing.assert_allclose(run(g, x), conv2d(x, w, None, pad=1) * gamma, rtol=1e-4, atol=1e-4)


def test_refuses_activation_other_uses_variable_and_integer_factors():
    w, gamma = rand(6, 4, 3, 3), rand(1, 6, 1, 1)
    g = conv_mul_graph(w, None, gamma, (1, 4, 5, 5))
    g.nodes[0].params["activation"] = "relu"  # gamma * relu(conv) is not a conv
    fuse_conv_scale(g)
    assert [n.op_type for n in g.nodes] == ["Conv", "Mul"]

    g = conv_mul_graph(w, None, gamma, (1, 4, 5, 5))
    g.outputs.append(g.nodes[0].outputs[0])  # the conv's own output is also read
    fuse_conv_scale(g)
    assert [n.op_type for n in g.nodes] == ["Conv", "Mul"]

    g = conv_mul_graph(w, None, gamma, (1, 4, 5, 5))
    s = g.value("s", (1, 6, 1, 1), np.float32)  # a run-time factor
    g.inputs.append(s)
    g.set_input(g.nodes[1], 1, s)
    infer_shapes(g)
    fuse_conv_scale(g)
    assert [n.op_type for n in g.nodes] == ["Conv", "Mul"]

    g = conv_mul_graph(w, None, np.ones((1, 6, 1, 1), np.int64), (1, 4, 5, 5))
    fuse_conv_scale(g)
    assert [n.op_type for n in g.nodes] == ["Conv", "Mul"]


@pytest.mark.parametrize("w_val, gamma_val", [(0.0, np.inf), (1e30, 1e20), (1.0, np.nan)],
                         ids=["zero_tap_times_inf", "overflowing_product", "nan_scale"])
def test_non_finite_constants_or_folds_stay_a_mul(w_val, gamma_val):
    # folded, 0 * inf would be NaN in the weight (the unfused conv gives 0 there, times inf: inf or NaN only where
    # the input says so) and 1e30 * 1e20 overflows float32 where conv-then-mul stays finite
    w = np.full((2, 1, 1, 1), w_val, np.float32)
    g = conv_mul_graph(w, None, np.array([gamma_val, 1.0], np.float32).reshape(1, 2, 1, 1), (1, 1, 2, 2),
                       params=dict(PARAMS, pads=(0, 0, 0, 0)))
    fuse_conv_scale(g)
    assert [n.op_type for n in g.nodes] == ["Conv", "Mul"]
    np.testing.assert_array_equal(g.nodes[0].attrs["weight"], w)
