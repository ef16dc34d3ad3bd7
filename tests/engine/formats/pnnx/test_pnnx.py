"""The pnnx reader on hand-written .pnnx.param texts (in the converter's real spelling) with small weights."""

from __future__ import annotations

import numpy as np
import pytest

from engine.formats.pnnx.param_values import format_param, parse_annotation, parse_param
from engine.formats.pnnx.reader import bin_path_for, load_graph
from engine.formats.pnnx.writer import attribute_specs, write_pnnx

# Model (a) of ../shared/docs/pnnx-experiments.md, cut down: the dynamic export of a conv/relu/residual/fc net.
RESNET = """7767517
8 8
pnnx.Input               pnnx_input_0             0 1 0 #0=(?,3,?,?)f32
nn.Conv2d                convbn2d_0               1 1 0 1 bias=True dilation=(1,1) groups=1 in_channels=3 kernel_size=(3,3) out_channels=4 padding=(1,1) padding_mode=zeros stride=(1,1) @bias=(4)f32 @weight=(4,3,3,3)f32 $input=0 #0=(?,3,?,?)f32 #1=(?,4,?,?)f32
nn.ReLU                  relu                     1 1 1 2 #1=(?,4,?,?)f32 #2=(?,4,?,?)f32
pnnx.Expression          pnnx_expr_2              2 1 2 1 3 expr=add(@0,@1) #2=(?,4,?,?)f32 #1=(?,4,?,?)f32 #3=(?,4,?,?)f32
nn.AdaptiveAvgPool2d     avgpool                  1 1 3 4 output_size=(1,1) #3=(?,4,?,?)f32 #4=(?,4,1,1)f32
torch.flatten            torch.flatten_0          1 1 4 5 end_dim=-1 start_dim=1 $input=4 #4=(?,4,1,1)f32 #5=(?,4)f32
nn.Linear                fc                       1 1 5 6 bias=True in_features=4 out_features=10 @bias=(10)f32 @weight=(10,4)f32 #5=(?,4)f32 #6=(?,10)f32
pnnx.Output              pnnx_output_0            1 0 6 #6=(?,10)f32
"""  # noqa: E501

# Two inputs, a pnnx.Attribute, a list expression feeding $size, and a tuple output (model (c) and (f) forms).
DYNAMIC = """7767517
9 9
pnnx.Input               pnnx_input_0             0 1 0 #0=(1,3,?,?)f32
pnnx.Input               pnnx_input_1             0 1 1 #1=(1,6)i64
pnnx.Attribute           scale                    0 1 2 @data=(1,3,1,1)f32 #2=(1,3,1,1)f32
pnnx.Expression          pnnx_expr_10             2 1 0 2 3 expr=add(mul(@0,@1),1.5) #0=(1,3,?,?)f32 #2=(1,3,1,1)f32 #3=(1,3,?,?)f32
pnnx.Expression          pnnx_expr_7              1 1 0 4 expr=[size(@0,2),size(@0,3)] #0=(1,3,?,?)f32
F.upsample               F.upsample_6             2 1 3 4 5 align_corners=False mode=bilinear $input=3 $size=4 #3=(1,3,?,?)f32 #5=(1,3,?,?)f32
torch.mean               torch.mean_2             1 1 5 6 dim=(2,3) keepdim=False $input=5 #5=(1,3,?,?)f32 #6=(1,3)f32
prim::TupleConstruct     pnnx_34                  3 1 6 5 1 7 #6=(1,3)f32 #5=(1,3,?,?)f32
pnnx.Output              pnnx_output_0            1 0 7
"""  # noqa: E501


def _weights(text: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(d) for k, (s, d) in attribute_specs(text).items()}


def test_resnet_structure_params_and_weights(tmp_path):
    weights = _weights(RESNET)
    g = load_graph(write_pnnx(tmp_path / "r.pnnx.param", RESNET, weights))
    assert [v.name for v in g.inputs] == ["in0"] and [v.name for v in g.outputs] == ["out0"]
    assert g.inputs[0].shape == (-1, 3, -1, -1) and g.inputs[0].dtype == np.float32
    assert g.outputs[0].shape == (-1, 10)
    assert [n.op_type for n in g.nodes] == ["pnnx:nn.Conv2d", "pnnx:nn.ReLU", "pnnx:pnnx.Expression",
                                            "pnnx:nn.AdaptiveAvgPool2d", "pnnx:torch.flatten", "pnnx:nn.Linear"]
    conv = g.nodes[0]
    assert conv.params["kernel_size"] == [3, 3] and conv.params["padding_mode"] == "zeros"
    assert conv.params["bias"] is True and conv.params["$inputs"] == ["input"]
    np.testing.assert_array_equal(conv.attrs["weight"], weights["convbn2d_0.weight"])
    assert conv.source == "r.pnnx.param:4"
    assert g.nodes[2].params["expr"] == "add(@0,@1)"
    assert g.nodes[2].inputs == [g.nodes[1].outputs[0], conv.outputs[0]]
    assert g.meta["format"] == "pnnx" and g.meta["operators"] == 8
    g.validate()


def test_weights_are_views_of_the_mapped_file(tmp_path):
    g = load_graph(write_pnnx(tmp_path / "r.pnnx.param", RESNET, _weights(RESNET)))
    w = g.nodes[0].attrs["weight"]
    assert not w.flags.owndata and not w.flags.writeable


def test_attribute_list_expression_and_tuple_output(tmp_path):
    weights = _weights(DYNAMIC)
    g = load_graph(write_pnnx(tmp_path / "d.pnnx.param", DYNAMIC, weights))
    assert [v.name for v in g.inputs] == ["in0", "in1"]
    assert g.inputs[1].dtype == np.int64 and g.inputs[1].shape == (1, 6)
    # The tuple (mean, upsample, second input) is flattened in order; an input stays named in1.
    assert [v.name for v in g.outputs] == ["out0", "out1", "in1"]
    assert g.outputs[2] is g.inputs[1]
    expr = g.nodes[0]
    assert expr.inputs[1].is_const
    np.testing.assert_array_equal(expr.inputs[1].const, weights["scale.data"])
    assert g.nodes[1].params["expr"] == "[size(@0,2),size(@0,3)]"  # raw, not split as a list
    up = g.nodes[2]
    assert up.params["$inputs"] == ["input", "size"] and up.inputs[1] is g.nodes[1].outputs[0]
    assert up.inputs[1].shape is None  # a list operand has no annotation
    assert not any(n.op_type.endswith(("Attribute", "TupleConstruct", "Input", "Output")) for n in g.nodes)
    g.validate()


def test_graph_without_attributes_needs_no_bin(tmp_path):
    text = "7767517\n3 2\npnnx.Input in 0 1 a #a=(2,2)f32\nF.relu r 1 1 a b $input=a\npnnx.Output out 1 0 b\n"
    p = tmp_path / "m.pnnx.param"
    p.write_text(text)
    g = load_graph(p)
    assert g.nodes[0].op_type == "pnnx:F.relu" and g.outputs[0].name == "out0"
    assert g.meta["weights"] is None


def test_operand_names_are_opaque_and_one_operand_can_feed_twice(tmp_path):
    text = ("7767517\n3 3\npnnx.Input in 0 1 x.1 #x.1=(2,3)f32\n"
            "torch.matmul mm 2 1 x.1 x.1 input.5 $input=x.1 $other=x.1\npnnx.Output out 1 0 input.5\n")
    p = tmp_path / "m.pnnx.param"
    p.write_text(text)
    g = load_graph(p)
    mm = g.nodes[0]
    assert mm.inputs[0] is mm.inputs[1] is g.inputs[0]
    assert mm.params["$inputs"] == ["input", "other"]
    assert len(g.inputs[0].consumers) == 2


@pytest.mark.parametrize("text, value", [
    ("None", None), ("()", None), ("[]", None), ("True", True), ("False", False),
    ("-12", -12), ("3", 3), ("0.5", 0.5), ("2.0", 2.0), ("1.000000e-5", 1e-5), ("-1.0", -1.0),
    ("(1,2,3)", [1, 2, 3]), ("(2.0,2.0)", [2.0, 2.0]), ("(1)", [1]), ("(a,b)", ["a", "b"]),
    ("nearest", "nearest"), ("torch.float", "torch.float"), ("2147483647", 2147483647),
    ("1.000000e+00+2.000000e+00j", 1 + 2j), ("[1,-1,6]", [1, -1, 6]),
])
def test_param_grammar(text, value):
    assert parse_param(text) == value


@pytest.mark.parametrize("value", [None, True, 3, -7, 0.5, 1e-5, 2.0, [1, 2], [2.0, 0.5], "same", ["a", "b"]])
def test_param_format_round_trip(value):
    assert parse_param(format_param(value)) == value


@pytest.mark.parametrize("text, parsed", [
    ("(1,3,64,64)f32", ((1, 3, 64, 64), "f32")), ("(?,3,?,?)f32", ((-1, 3, -1, -1), "f32")),
    ("()f32", ((), "f32")), ("(1,6)i64", ((1, 6), "i64")), ("(8)bool", ((8,), "bool")),
    ("(1,%c,4)f16", ((1, -1, 4), "f16")),
])
def test_annotation_grammar(text, parsed):
    assert parse_annotation(text) == parsed


def test_bin_path():
    assert bin_path_for("a/m.pnnx.param").as_posix() == "a/m.pnnx.bin"
    assert bin_path_for("m.param").as_posix() == "m.bin"


def test_bfloat16_and_int_weights(tmp_path):
    text = ("7767517\n4 3\npnnx.Input in 0 1 0 #0=(1,2)f32\npnnx.Attribute a 0 1 1 @data=(2)bf16\n"
            "pnnx.Attribute b 0 1 2 @data=(2,2)i32\npnnx.Output out 3 0 0 1 2\n")
    w = np.array([1.5, -2.25], np.float32)
    bf16 = (w.view(np.uint32) >> 16).astype(np.uint16)
    g = load_graph(write_pnnx(tmp_path / "m.pnnx.param", text, {"a.data": bf16,
                                                                 "b.data": np.arange(4, dtype=np.int32)}))
    np.testing.assert_array_equal(g.outputs[1].const, w)
    assert g.outputs[2].const.dtype == np.int32 and g.outputs[2].const.shape == (2, 2)
