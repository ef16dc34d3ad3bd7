"""fuse_conv_bn: folded weights give what conv-then-batchnorm gives in plain numpy."""

from __future__ import annotations

import numpy as np
import pytest
from np_ref import conv2d, conv_transpose2d

from engine.ir import Graph
from engine.passes.fuse_conv_bn import fuse_conv_bn
from engine.runtime.model import Model

rng = np.random.default_rng(0)


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def conv_bn_graph(op: str, weight, bias, scale, shift, params, x_shape, bn_out_is_output=True):
    g = Graph()
    x = g.value("x", x_shape, np.float32)
    g.inputs = [x]
    attrs = {"weight": weight} if bias is None else {"weight": weight, "bias": bias}
    c = g.add_node(op, [x], name="conv", params=params, attrs=attrs).outputs[0]
    y = g.add_node("BatchNorm", [c], name="bn", attrs={"scale": scale, "bias": shift}).outputs[0]
    y.name = "y"
    g.outputs = [y]
    return g


def run(g: Graph, x: np.ndarray) -> np.ndarray:
    return Model(g, "test").instance().run({"x": x})["y"]


@pytest.mark.parametrize("groups,with_bias", [(1, True), (2, False)])
def test_conv_bn_folds_into_conv(groups, with_bias):
    w, b = rand(6, 4 // groups, 3, 3), rand(6) if with_bias else None
    scale, shift = rand(6), rand(6)
    params = {"stride": (1, 1), "pads": (1, 1, 1, 1), "dilation": (1, 1), "groups": groups}
    g = conv_bn_graph("Conv", w, b, scale, shift, params, (2, 4, 5, 5))
    fuse_conv_bn(g)
    g.validate()
    assert [n.op_type for n in g.nodes] == ["Conv"] and g.outputs[0].name == "y"
    x = rand(2, 4, 5, 5)
    want = conv2d(x, w, b, pad=1, groups=groups) * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1)
    np.testing.assert_allclose(run(g, x), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("groups", [1, 2])
def test_conv_transpose_bn_scales_output_channels(groups):
    w, b = rand(4, 6 // groups, 2, 2), rand(6)
    scale, shift = rand(6), rand(6)
    params = {"stride": (2, 2), "pads": (0, 0, 0, 0), "output_padding": (0, 0), "dilation": (1, 1),
              "groups": groups}
    g = conv_bn_graph("ConvTranspose", w, b, scale, shift, params, (1, 4, 3, 3))
    fuse_conv_bn(g)
    assert [n.op_type for n in g.nodes] == ["ConvTranspose"]
    x = rand(1, 4, 3, 3)
    want = conv_transpose2d(x, w, b, stride=2, groups=groups) * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1)
    np.testing.assert_allclose(run(g, x), want, rtol=1e-4, atol=1e-4)


def test_gemm_bn_folds_weights_on_2d_outputs():
    w, b, scale, shift = rand(5, 3), rand(5), rand(5), rand(5)
    g = conv_bn_graph("Gemm", w, b, scale, shift, {}, (4, 3))
    g.nodes[0].outputs[0].shape = (4, 5)
    fuse_conv_bn(g)
    gemm = g.nodes[0]
    assert [n.op_type for n in g.nodes] == ["Gemm"]
    x = rand(4, 3)
    got = x @ gemm.attrs["weight"].T + gemm.attrs["bias"]
    np.testing.assert_allclose(got, (x @ w.T + b) * scale + shift, rtol=1e-5, atol=1e-5)


def test_not_fused_when_conv_output_has_another_use_or_is_an_output():
    w, scale, shift = rand(2, 2, 1, 1), rand(2), rand(2)
    params = {"stride": (1, 1), "pads": (0, 0, 0, 0), "dilation": (1, 1), "groups": 1}
    g = conv_bn_graph("Conv", w, None, scale, shift, params, (1, 2, 3, 3))
    g.outputs.append(g.nodes[0].outputs[0])
    fuse_conv_bn(g)
    assert [n.op_type for n in g.nodes] == ["Conv", "BatchNorm"]
    g2 = conv_bn_graph("Conv", w, None, scale, shift, params, (1, 2, 3, 3))
    g2.add_node("Relu", [g2.nodes[0].outputs[0]])
    fuse_conv_bn(g2)
    assert [n.op_type for n in g2.nodes] == ["Conv", "BatchNorm", "Relu"]


def test_pipeline_turns_conv_bn_relu_dropout_into_one_conv():
    from engine.passes.pipeline import run_pipeline

    w, b, scale, shift = rand(4, 3, 3, 3), rand(4), rand(4), rand(4)
    params = {"stride": (1, 1), "pads": (1, 1, 1, 1), "dilation": (1, 1), "groups": 1}
    g = conv_bn_graph("Conv", w, b, scale, shift, params, (1, 3, 6, 6))
    bn_out = g.outputs[0]
    r = g.add_node("Relu", [bn_out]).outputs[0]
    y = g.add_node("Identity", [r]).outputs[0]
    bn_out.name, y.name = "bn_out", "y"
    g.outputs = [y]
    run_pipeline(g)
    assert [(n.op_type, n.params.get("activation")) for n in g.nodes] == [("Conv", "relu")]
    assert g.outputs[0].name == "y" and g.outputs[0].shape == (1, 4, 6, 6)
    x = rand(1, 3, 6, 6)
    bn = conv2d(x, w, b, pad=1) * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1)
    np.testing.assert_allclose(run(g, x), np.maximum(bn, 0), rtol=1e-4, atol=1e-4)
