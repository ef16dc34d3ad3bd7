"""lower_pnnx: pnnx ops -> canonical ops. Checked three ways: the node types and params on hand-written
.pnnx.param texts; the lowered graph run node by node through the ops' numpy references against plain numpy;
and real pnnx exports (tests/fixtures/pnnx_lower from tools/make_lower_pnnx_fixtures.py, and the model
fixtures in tests/fixtures/pnnx) against their PyTorch outputs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import engine
from engine.errors import ModelFormatError, UnsupportedOpError
from engine.formats.pnnx.lowering.lower import lower_pnnx
from engine.formats.pnnx.reader import load_graph
from engine.formats.pnnx.writer import attribute_specs, write_pnnx
from engine.ir import Graph
from engine.ops import get_op

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
RNG = np.random.default_rng(7)


def lower(tmp_path, body: str, weights: dict | None = None) -> Graph:
    """Writes a param text (header added) with random weights for every @ item not given, loads and lowers."""
    lines = [ln for ln in body.strip().splitlines() if ln.strip()]
    text = f"7767517\n{len(lines)} {len(lines)}\n" + "\n".join(lines) + "\n"
    specs = attribute_specs(text)
    w = {k: RNG.standard_normal(s).astype(d) for k, (s, d) in specs.items()} | (weights or {})
    return lower_pnnx(load_graph(write_pnnx(tmp_path / "m.pnnx.param", text, w)))


def run(graph: Graph, *inputs: np.ndarray) -> list[np.ndarray]:
    """Executes the lowered graph with each op's numpy reference."""
    env = {id(v): a for v, a in zip(graph.inputs, inputs, strict=True)}
    for node in graph.nodes:
        outs = get_op(node.op_type).reference(node, [v.const if v.is_const else env[id(v)] for v in node.inputs])
        env.update((id(v), a) for v, a in zip(node.outputs, outs, strict=True))
    return [v.const if v.is_const else env[id(v)] for v in graph.outputs]


def ops(graph: Graph) -> list[str]:
    return [n.op_type for n in graph.nodes]


def attr(tmp_path, name: str) -> np.ndarray:
    """A weight as written to the test's .pnnx.bin."""
    import zipfile

    with zipfile.ZipFile(tmp_path / "m.pnnx.bin") as z:
        return z.read(name)


def conv_ref(x, w, b, stride, pads, dilation=(1, 1), groups=1, mode="constant"):
    """Plain numpy cross-correlation (pads t, l, b, r)."""
    t, l, bo, r = pads
    x = np.pad(x, ((0, 0), (0, 0), (t, bo), (l, r)), mode=mode)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh = (h - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    for oc in range(o):
        g = oc // (o // groups)
        for i in range(kh):
            for j in range(kw):
                patch = x[:, g * cg:(g + 1) * cg, i * dilation[0]:i * dilation[0] + stride[0] * (oh - 1) + 1:stride[0],
                          j * dilation[1]:j * dilation[1] + stride[1] * (ow - 1) + 1:stride[1]]
                out[:, oc] += np.einsum("nchw,c->nhw", patch, w[oc, :, i, j])
    return out + (0 if b is None else b[None, :, None, None])


# -- convolution, norms, linear --------------------------------------------------------------------------------
def test_conv_same_dilated_even_kernel(tmp_path):
    g = lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(1,2,7,8)f32
nn.Conv2d c 1 1 0 1 bias=True dilation=(2,1) groups=1 in_channels=2 kernel_size=(4,3) out_channels=3 padding=same padding_mode=zeros stride=(1,1) @bias=(3)f32 @weight=(3,2,4,3)f32
pnnx.Output out 1 0 1
""")  # noqa: E501
    (conv,) = g.nodes
    assert conv.op_type == "Conv" and conv.params["pads"] == [3, 1, 3, 1]  # total 6 rows, 2 columns
    assert conv.params["pad_mode"] == "zeros" and conv.params["groups"] == 1
    assert conv.attrs["weight"].dtype == np.float32
    x = RNG.standard_normal((1, 2, 7, 8)).astype(np.float32)
    want = conv_ref(x, conv.attrs["weight"], conv.attrs["bias"], (1, 1), [3, 1, 3, 1], (2, 1))
    np.testing.assert_allclose(run(g, x)[0], want, rtol=1e-5, atol=1e-5)


def test_conv_same_odd_total_pads_at_the_end(tmp_path):
    g = lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(1,1,5,5)f32
nn.Conv2d c 1 1 0 1 bias=False dilation=(1,1) groups=1 in_channels=1 kernel_size=(2,4) out_channels=1 padding=same padding_mode=zeros stride=(1,1) @weight=(1,1,2,4)f32
pnnx.Output out 1 0 1
""")  # noqa: E501
    assert g.nodes[0].params["pads"] == [0, 1, 1, 2] and "bias" not in g.nodes[0].attrs


def test_conv_reflect_grouped(tmp_path):
    g = lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(1,4,6,6)f32
nn.Conv2d c 1 1 0 1 bias=True dilation=(1,1) groups=2 in_channels=4 kernel_size=(3,3) out_channels=4 padding=(1,2) padding_mode=reflect stride=(2,1) @bias=(4)f32 @weight=(4,2,3,3)f32
pnnx.Output out 1 0 1
""")  # noqa: E501
    conv = g.nodes[0]
    assert conv.params["pads"] == [1, 2, 1, 2] and conv.params["pad_mode"] == "reflect"
    x = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)
    want = conv_ref(x, conv.attrs["weight"], conv.attrs["bias"], (2, 1), [1, 2, 1, 2], groups=2, mode="reflect")
    np.testing.assert_allclose(run(g, x)[0], want, rtol=1e-5, atol=1e-5)


def test_batchnorm_is_folded(tmp_path):
    mean, var = RNG.standard_normal(3).astype(np.float32), RNG.uniform(0.5, 2, 3).astype(np.float32)
    gamma, beta = RNG.standard_normal(3).astype(np.float32), RNG.standard_normal(3).astype(np.float32)
    text = """
pnnx.Input in 0 1 0 #0=(2,3,4,4)f32
nn.BatchNorm2d bn 1 1 0 1 affine=True eps=1.000000e-3 num_features=3 @bias=(3)f32 @running_mean=(3)f32 @running_var=(3)f32 @weight=(3)f32
pnnx.Output out 1 0 1
"""  # noqa: E501
    g = lower(tmp_path, text, {"bn.running_mean": mean, "bn.running_var": var, "bn.weight": gamma, "bn.bias": beta})
    bn = g.nodes[0]
    assert bn.op_type == "BatchNorm" and set(bn.attrs) == {"scale", "bias"}
    x = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)
    c = (slice(None), None, None)
    want = (x - mean[c]) / np.sqrt(var[c] + 1e-3) * gamma[c] + beta[c]
    np.testing.assert_allclose(run(g, x)[0], want, rtol=1e-5, atol=1e-5)


def test_linear_gelu_relu6_clamp(tmp_path):
    g = lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(2,5,4)f32
nn.Linear fc 1 1 0 1 bias=True in_features=4 out_features=6 @bias=(6)f32 @weight=(6,4)f32 #0=(2,5,4)f32 #1=(2,5,6)f32
nn.GELU act 1 1 1 2 approximate=tanh
F.gelu g2 1 1 2 3 $input=2
nn.ReLU6 r6 1 1 3 4
torch.clamp cl 1 1 4 5 max=None min=0.5 $input=4
pnnx.Output out 1 0 5
""")  # noqa: E501
    assert ops(g) == ["Gemm", "Gelu", "Gelu", "Clip", "Clip"]
    assert g.nodes[1].params["approximate"] == "tanh" and g.nodes[2].params["approximate"] == "none"
    assert g.nodes[3].params == {"min": 0.0, "max": 6.0} and g.nodes[4].params == {"min": 0.5, "max": None}
    x = RNG.standard_normal((2, 5, 4)).astype(np.float32)
    fc = g.nodes[0]
    y = x.astype(np.float64) @ fc.attrs["weight"].T + fc.attrs["bias"]
    y = 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3)))
    y = 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2)))
    want = np.clip(np.clip(y, 0, 6), 0.5, None)
    np.testing.assert_allclose(run(g, x)[0], want, rtol=1e-5, atol=1e-6)


def test_aten_clamp_min_max_literal_and_tensor_bounds(tmp_path):
    # F.normalize as pnnx leaves it unfolded (torchvision's Swin-V2): norm.clamp_min(eps) with an input-less
    # Expression for eps; a tensor bound broadcasts (torch.clamp_min(x, t))
    g = lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(2,3,4)f32
pnnx.Input bound 0 1 1 #1=(2,1,4)f32
pnnx.Expression eps 0 1 2 expr=1.000000e-01
aten::clamp_min lo 2 1 0 2 3 #0=(2,3,4)f32 #3=(2,3,4)f32
pnnx.Expression cap 0 1 4 expr=2.5
aten::clamp_max hi 2 1 3 4 5 #3=(2,3,4)f32 #5=(2,3,4)f32
aten::clamp_min tlo 2 1 5 1 6 #5=(2,3,4)f32 #1=(2,1,4)f32 #6=(2,3,4)f32
aten::clamp_max thi 2 1 6 1 7 #6=(2,3,4)f32 #1=(2,1,4)f32 #7=(2,3,4)f32
pnnx.Output out 1 0 7
""")
    assert ops(g) == ["Clip", "Clip", "Maximum", "Minimum"]
    assert g.nodes[0].params == {"min": 0.1, "max": None} and g.nodes[1].params == {"min": None, "max": 2.5}
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32) * 3
    x[0, 0, 0], x[1, 2, 3] = np.nan, np.inf
    t = RNG.standard_normal((2, 1, 4)).astype(np.float32)
    want = np.minimum(np.maximum(np.clip(x, np.float32(0.1), np.float32(2.5)), t), t)  # NaN stays NaN, as torch's
    np.testing.assert_array_equal(run(g, x, t)[0], want)
    model = engine.load(tmp_path / "m.pnnx.param")
    np.testing.assert_array_equal(model.instance("cpu").run({"in0": x, "in1": t})["out0"], want)


def test_aten_clamp_integer_input_constant_and_computed_bounds(tmp_path):
    # idx.clamp_min(0) stays int64; a buffer bound of several elements, and a bound computed at run time
    # (x.clamp_max(x.mean() * 2): an Expression, whose output pnnx leaves untyped), broadcast as torch's
    g = lower(tmp_path, """
pnnx.Input ids 0 1 0 #0=(2,3)i64
pnnx.Expression zero 0 1 1 expr=0
aten::clamp_min lo 2 1 0 1 2 #0=(2,3)i64 #2=(2,3)i64
pnnx.Input in 0 1 3 #3=(2,3,4)f32
pnnx.Attribute buf 0 1 4 @data=(4)f32 #4=(4)f32
aten::clamp_min vec 2 1 3 4 5 #3=(2,3,4)f32 #4=(4)f32 #5=(2,3,4)f32
torch.mean mean 1 1 3 6 dim=None keepdim=False $input=3 #3=(2,3,4)f32 #6=()f32
pnnx.Expression twice 1 1 6 7 expr=mul(@0,2)
aten::clamp_max hi 2 1 5 7 8 #5=(2,3,4)f32 #8=(2,3,4)f32
pnnx.Output out 2 0 2 8
""", {"buf.data": np.array([-1.0, 0.0, 0.5, 1.0], np.float32)})
    assert [op for op in ops(g) if op in ("Clip", "Maximum", "Minimum")] == ["Clip", "Maximum", "Minimum"]
    ids = np.array([[-3, 0, 2], [5, -1, 7]], np.int64)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32) + 0.5
    want = np.minimum(np.maximum(x, np.array([-1.0, 0.0, 0.5, 1.0], np.float32)), x.mean() * 2)
    model = engine.load(tmp_path / "m.pnnx.param")
    got = model.instance("cpu").run({"in0": ids, "in1": x})
    assert got["out0"].dtype == np.int64
    np.testing.assert_array_equal(got["out0"], np.maximum(ids, 0))
    np.testing.assert_allclose(got["out1"], want, rtol=1e-6)


def test_aten_clamp_bound_from_a_creation_op(tmp_path):
    # x.clamp_min(torch.full((4,), 0.1)): an input-less producer that is no Expression is a tensor bound
    # (Maximum, broadcast), not a literal refused as "a run-time bound"
    g = lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(2,3,4)f32
torch.full full 0 1 1 size=(4) fill_value=1.000000e-01 #1=(4)f32
aten::clamp_min lo 2 1 0 1 2 #0=(2,3,4)f32 #1=(4)f32 #2=(2,3,4)f32
pnnx.Output out 1 0 2
""")
    assert "Maximum" in ops(g) and "Clip" not in ops(g)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    x[0, 0, 0] = np.nan
    got = engine.load(tmp_path / "m.pnnx.param").instance("cpu").run({"in0": x})["out0"]
    np.testing.assert_array_equal(got, np.maximum(x, np.float32(0.1)))


def test_aten_clamp_refuses_float_bounds_on_integers_and_mixed_dtypes(tmp_path):
    # torch promotes an int64 input with a float bound to float: refused, not computed as integers
    float_bound = r"m.pnnx.param:5: .*aten::clamp_min with bound=0.1 for an input of dtype int64"
    with pytest.raises(UnsupportedOpError, match=float_bound):
        lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(2,3)i64
pnnx.Expression eps 0 1 1 expr=1.000000e-01
aten::clamp_min lo 2 1 0 1 2 #0=(2,3)i64 #2=(2,3)i64
pnnx.Output out 1 0 2
""")
    mixed = r"m.pnnx.param:5: .*bound tensor of dtype float16 for an input of dtype float32"
    with pytest.raises(UnsupportedOpError, match=mixed):
        lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(2,3)f32
pnnx.Input bound 0 1 1 #1=(2,3)f16
aten::clamp_max hi 2 1 0 1 2 #0=(2,3)f32 #1=(2,3)f16 #2=(2,3)f32
pnnx.Output out 1 0 2
""")


def test_aten_zero_is_refused_with_the_export_bug(tmp_path):
    # pnnx's form of Swin-V2's `qkv_bias[n:2 * n].zero_()`: the zeroed slice reaches the linear as its whole bias
    # (docs/pnnx_export_bugs.md, 9); a loader cannot tell that the value was a slice, so aten::zero is refused
    text = """7767517
4 4
pnnx.Input in 0 1 0 #0=(2,3)f32
pnnx.Attribute b 0 1 1 @data=(3)f32 #1=(3)f32
aten::zero z 1 1 1 2 #1=(3)f32 #2=(3)f32
pnnx.Output out 1 0 2
"""
    path = write_pnnx(tmp_path / "m.pnnx.param", text, {"b.data": np.ones(3, np.float32)})
    with pytest.raises(UnsupportedOpError, match=r"node 'z', m.pnnx.param:5\) \(an in-place zero_\(\).*"
                                                 r"pnnx_export_bugs.md"):
        engine.load(path)
    with pytest.raises(UnsupportedOpError, match=r"m.pnnx.param:5: unsupported op [\"']aten::zero \(an in-place "
                                                 r"zero_\(\).*pnnx_export_bugs.md\)[\"'] \(node 'z'\)$"):
        lower_pnnx(load_graph(path))  # the lowering alone says why too


def test_embedding_is_gather_on_a_const_table(tmp_path):
    g = lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(1,5)i64
nn.Embedding emb 1 1 0 1 embedding_dim=3 num_embeddings=10 sparse=False @weight=(10,3)f32
pnnx.Output out 1 0 1
""")  # noqa: E501
    (node,) = g.nodes
    assert node.op_type == "Gather" and node.params["axis"] == 0 and node.inputs[0].is_const
    ids = np.array([[0, 9, 3, 3, 1]])
    np.testing.assert_array_equal(run(g, ids)[0], node.inputs[0].const[ids])


# -- resize, pad, shuffles ---------------------------------------------------------------------------------------
def test_resize_forms(tmp_path):
    g = lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(1,3,?,?)f32
nn.Upsample up 1 1 0 1 mode=nearest scale_factor=(2.0,2.0) size=None
F.upsample fu 1 1 0 2 align_corners=True mode=bilinear scale_factor=(2.0,2.0) $input=0
pnnx.Expression sz 1 1 0 3 expr=[size(@0,2),size(@0,3)]
F.upsample fs 2 1 1 3 4 align_corners=False mode=bilinear $input=1 $size=3
pnnx.Output out 3 0 2 4 4
""")  # noqa: E501
    up, fu, sz, fs = g.nodes
    assert up.op_type == fu.op_type == fs.op_type == "Resize" and sz.op_type == "Expression"
    assert up.params["mode"] == "nearest" and up.params["scale"] == [2.0, 2.0] and up.params["size"] is None
    assert fu.params["align_corners"] is True and fu.params["coordinate"] == "torch"
    assert fs.inputs[1] is sz.outputs[0] and fs.params["size"] is None  # $size stays input 1
    assert sz.params["expr"] == "[size(@0,2),size(@0,3)]"
    x = RNG.standard_normal((1, 3, 2, 3)).astype(np.float32)
    a, b, c = run(g, x)
    assert a.shape == (1, 3, 4, 6) and b.shape == c.shape == (1, 3, 2, 3)
    # align_corners=True at scale 2: output row i samples input row i * (h - 1) / (2h - 1)
    ry, rx = np.arange(4) * 1 / 3, np.arange(6) * 2 / 5
    y0, x0 = np.floor(ry).astype(int), np.floor(rx).astype(int)
    y1, x1 = np.minimum(y0 + 1, 1), np.minimum(x0 + 1, 2)
    fy, fx = (ry - y0)[:, None], (rx - x0)[None, :]
    want = (x[..., y0, :][..., x0] * (1 - fy) * (1 - fx) + x[..., y0, :][..., x1] * (1 - fy) * fx
            + x[..., y1, :][..., x0] * fy * (1 - fx) + x[..., y1, :][..., x1] * fy * fx)
    np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-6)
    # nearest x2 and then bilinear back to the input size (half-pixel centres) averages 2x2 equal samples
    np.testing.assert_allclose(c, x, rtol=1e-5, atol=1e-6)


def test_pad_goes_to_onnx_order(tmp_path):
    g = lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(1,2,3,4)f32
F.pad p 1 1 0 1 mode=replicate pad=(1,2,0,3) value=None $input=0 #0=(1,2,3,4)f32
F.pad q 1 1 1 2 mode=constant pad=(1,1) value=0.5 $input=1 #1=(1,2,6,7)f32
pnnx.Output out 1 0 2
""")  # noqa: E501
    p, q = g.nodes
    assert p.params == {"pads": [0, 0, 0, 1, 0, 0, 3, 2], "mode": "edge", "value": 0.0}
    assert q.params["pads"] == [0, 0, 0, 1, 0, 0, 0, 1] and q.params["value"] == 0.5
    x = RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)
    want = np.pad(np.pad(x, ((0, 0), (0, 0), (0, 3), (1, 2)), mode="edge"), ((0, 0), (0, 0), (0, 0), (1, 1)),
                  constant_values=0.5)
    np.testing.assert_array_equal(run(g, x)[0], want)


def test_shuffles(tmp_path):
    g = lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(1,8,2,2)f32
nn.ChannelShuffle cs 1 1 0 1 groups=2 $input=0
nn.PixelShuffle ps 1 1 1 2 upscale_factor=2
pnnx.Output out 1 0 2
""")  # noqa: E501
    assert ops(g) == ["ChannelShuffle", "PixelShuffle"]
    x = RNG.standard_normal((1, 8, 2, 2)).astype(np.float32)
    shuffled = x.reshape(1, 2, 4, 2, 2).transpose(0, 2, 1, 3, 4).reshape(1, 8, 2, 2)
    want = shuffled.reshape(1, 2, 2, 2, 2, 2).transpose(0, 1, 4, 2, 5, 3).reshape(1, 2, 4, 4)
    np.testing.assert_array_equal(run(g, x)[0], want)


# -- shape, cut and join -------------------------------------------------------------------------------------------
def test_slices_selects_and_splits(tmp_path):
    g = lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(2,9,6,8)f32
Tensor.slice s1 1 1 0 1 dims=(1,2) ends=(0,5) selects=(1,2147483647) starts=(0,2) steps=(0,1) $input=0
Tensor.slice s2 1 1 0 2 dim=3 end=-1 start=1 step=2 $input=0
Tensor.select sel 1 1 0 3 dim=2 index=-1 $input=0
torch.unbind ub 1 2 1 4 5 dim=0
torch.chunk ch 1 2 0 7 8 chunks=2 dim=1 $input=0 #7=(2,5,6,8)f32 #8=(2,4,6,8)f32
torch.split sp 1 2 0 9 10 dim=3 split_size_or_sections=5 $tensor=0 #0=(2,9,6,8)f32
pnnx.Output out 8 0 2 3 4 5 7 8 9 10
""")  # noqa: E501
    assert ops(g) == ["Slice", "Squeeze", "Slice", "Gather", "Split", "Squeeze", "Squeeze", "Split", "Split"]
    sl, sq = g.nodes[:2]
    assert sl.params == {"starts": [1, 2], "ends": [2, 5], "axes": [1, 2], "steps": [1, 1]} and sq.params["axes"] == [1]
    assert g.nodes[3].inputs[1].const.shape == () and g.nodes[3].params["axis"] == 2
    assert g.nodes[7].params["sizes"] == [5, 4] and g.nodes[8].params["sizes"] == [5, 3]
    x = RNG.standard_normal((2, 9, 6, 8)).astype(np.float32)
    got = run(g, x)
    want = [x[:, :, :, 1:-1:2], x[:, :, -1], x[0, 1, 2:5], x[1, 1, 2:5], x[:, :5], x[:, 5:], x[..., :5], x[..., 5:]]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_reshape_flatten_permute_transpose_reduce(tmp_path):
    g = lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(2,3,4,5)f32
Tensor.reshape r 1 1 0 1 shape=(2,-1,5) $input=0
torch.transpose t 1 1 1 2 dim0=-1 dim1=1 $input=1 #1=(2,12,5)f32
Tensor.permute p 1 1 2 3 dims=(2,0,1) $input=2
torch.flatten f 1 1 3 4 end_dim=-1 start_dim=1 $input=3
torch.mean m 1 1 0 5 dim=(1) keepdim=False $input=0
torch.amax a 1 1 0 6 dim=(2,3) keepdim=True $input=0
torch.sum s 1 1 0 7 $input=0
torch.unsqueeze u 1 1 7 8 dim=0 $input=7
pnnx.Output out 4 0 4 5 6 8
""")  # noqa: E501
    assert ops(g) == ["Reshape", "Transpose", "Transpose", "Flatten", "ReduceMean", "ReduceMax", "ReduceSum",
                      "Unsqueeze"]
    assert g.nodes[1].params["perm"] == [0, 2, 1]
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    got = run(g, x)
    want = [x.reshape(2, -1, 5).transpose(0, 2, 1).transpose(2, 0, 1).reshape(12, -1), x.mean(1),
            x.max((2, 3), keepdims=True), x.sum()[None]]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_dynamic_reshape_keeps_its_shape_input(tmp_path):
    g = lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(?,4,6)f32
pnnx.Expression e 1 1 0 1 expr=[size(@0,0),-1,2]
Tensor.reshape r 2 1 0 1 2 $input=0 $shape=1
pnnx.Output out 1 0 2
""")  # noqa: E501
    assert ops(g) == ["Expression", "Reshape"] and g.nodes[1].inputs[1] is g.nodes[0].outputs[0]
    x = RNG.standard_normal((3, 4, 6)).astype(np.float32)
    np.testing.assert_array_equal(run(g, x)[0], x.reshape(3, -1, 2))


def test_dropout_and_identity_disappear(tmp_path):
    g = lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(2,3)f32
F.relu r 1 1 0 1 $input=0
nn.Dropout d 1 1 1 2
nn.Identity i 1 1 2 3
pnnx.Output out 1 0 3
""")  # noqa: E501
    assert ops(g) == ["Relu"] and g.outputs[0].name == "out0"


# -- expressions ------------------------------------------------------------------------------------------------
def test_elementwise_expression_becomes_ops_with_f32_scalars(tmp_path):
    g = lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(1,3,4,4)f32
pnnx.Attribute scale 0 1 1 @data=(1,3,1,1)f32 #1=(1,3,1,1)f32
pnnx.Expression e 2 1 0 1 2 expr=sub(add(mul(@0,@1),1.5),sqrt(abs(@0))) #0=(1,3,4,4)f32 #1=(1,3,1,1)f32 #2=(1,3,4,4)f32
pnnx.Output out 1 0 2
""")  # noqa: E501
    assert ops(g) == ["Mul", "Add", "Abs", "Sqrt", "Sub"]
    lit = g.nodes[1].inputs[1]
    assert lit.is_const and lit.const.shape == () and lit.const.dtype == np.float32
    x = RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)
    s = g.nodes[0].inputs[1].const
    out = run(g, x)[0]
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, x * s + 1.5 - np.sqrt(np.abs(x)), rtol=1e-6)


@pytest.mark.parametrize("expr, inputs", [
    ("[size(@0,2),size(@0,3)]", "#0=(1,3,4,4)f32"),  # list result
    ("add(@0,1.5)", "#0=(1,3,4,4)i64"),  # integer tensor with a float: torch promotion
    ("lshift(@0,1)", "#0=(1,3,4,4)f32"),  # no canonical op
])
def test_other_expressions_stay_expression_ops(tmp_path, expr, inputs):
    g = lower(tmp_path, f"""
pnnx.Input in 0 1 0 {inputs}
pnnx.Expression e 1 1 0 1 expr={expr} {inputs}
pnnx.Output out 1 0 1
""")  # noqa: E501
    assert ops(g) == ["Expression"] and g.nodes[0].params == {"expr": expr}


# -- attention ----------------------------------------------------------------------------------------------------
def np_softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_mha(q, k, v, w_in, b_in, w_out, b_out, heads, mask=None):
    """torch.nn.MultiheadAttention in plain numpy (batch-first arrays)."""
    e = q.shape[-1]
    d = e // heads
    proj = [x @ w.T + b for x, w, b in zip((q, k, v), np.split(w_in, 3), np.split(b_in, 3), strict=True)]
    qh, kh, vh = (p.reshape(p.shape[0], p.shape[1], heads, d).transpose(0, 2, 1, 3) for p in proj)
    s = qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(d)
    if mask is not None:
        s = np.where(mask, -np.inf, s) if mask.dtype == bool else s + mask
    o = (np_softmax(s) @ vh).transpose(0, 2, 1, 3).reshape(q.shape[0], q.shape[1], e)
    return o @ w_out.T + b_out


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_self(tmp_path, batch_first):
    shape = "(2,5,8)" if batch_first else "(5,2,8)"
    g = lower(tmp_path, f"""
pnnx.Input in 0 1 0 #0={shape}f32
nn.MultiheadAttention attn 1 1 0 1 add_bias_kv=False add_zero_attn=False batch_first={batch_first} bias=True embed_dim=8 kdim=8 num_heads=2 vdim=8 @in_proj_bias=(24)f32 @in_proj_weight=(24,8)f32 @out_proj.bias=(8)f32 @out_proj.weight=(8,8)f32 #0={shape}f32 #1={shape}f32
pnnx.Output out 1 0 1
""")  # noqa: E501
    assert "Attention" in ops(g) and ops(g).count("Gemm") == 2
    mha = {k: np.frombuffer(attr(tmp_path, f"attn.{k}"), np.float32) for k in
           ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")}
    x = RNG.standard_normal((2, 5, 8)).astype(np.float32)
    xin = x if batch_first else x.transpose(1, 0, 2).copy()
    want = np_mha(x, x, x, mha["in_proj_weight"].reshape(24, 8), mha["in_proj_bias"],
                  mha["out_proj.weight"].reshape(8, 8), mha["out_proj.bias"], 2)
    got = run(g, xin)[0]
    np.testing.assert_allclose(got if batch_first else got.transpose(1, 0, 2), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("batch, dtype", [(2, "bool"), (2, "f32"), (5, "bool")])
def test_multihead_attention_mask_shape_tells_key_padding_from_attn_mask(tmp_path, batch, dtype):
    """pnnx writes a key_padding_mask (N, S) like an attn_mask (L, S), tagged or not: a first dim equal to the
    batch and not to L makes it a key padding mask; N == L (here 5) leaves it an attn_mask, as pnnx reads it."""
    x_shape, m_shape = f"({batch},5,8)", f"({batch},5)" if batch != 5 else "(5,5)"
    g = lower(tmp_path, f"""
pnnx.Input in0 0 1 0 #0={x_shape}f32
pnnx.Input in1 0 1 1 #1={m_shape}{dtype}
nn.MultiheadAttention attn 2 1 0 1 2 add_bias_kv=False add_zero_attn=False batch_first=True bias=True embed_dim=8 kdim=8 num_heads=2 vdim=8 @in_proj_bias=(24)f32 @in_proj_weight=(24,8)f32 @out_proj.bias=(8)f32 @out_proj.weight=(8,8)f32 $attn_mask=1 #0={x_shape}f32 #1={m_shape}{dtype} #2={x_shape}f32
pnnx.Output out 1 0 2
""")  # noqa: E501
    mha = {k: np.frombuffer(attr(tmp_path, f"attn.{k}"), np.float32) for k in
           ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")}
    x = RNG.standard_normal((batch, 5, 8)).astype(np.float32)
    mask = RNG.random((batch, 5)) > 0.6
    mask[:, 0] = False  # never a whole row masked
    if dtype == "f32":
        mask = np.where(mask, -3.0, 0.5).astype(np.float32)
    key_padding = batch != 5
    want = np_mha(x, x, x, mha["in_proj_weight"].reshape(24, 8), mha["in_proj_bias"],
                  mha["out_proj.weight"].reshape(8, 8), mha["out_proj.bias"], 2,
                  mask[:, None, None, :] if key_padding else mask)
    reshapes = [n.params["shape"] for n in g.nodes if n.op_type == "Reshape"]
    assert ([0, 1, 1, -1] in reshapes) == key_padding
    np.testing.assert_allclose(run(g, x, mask)[0], want, rtol=1e-4, atol=1e-5)


def test_multihead_attention_with_both_masks_is_refused(tmp_path):
    with pytest.raises(UnsupportedOpError, match="both an attn_mask and a key_padding_mask"):
        lower(tmp_path, """
pnnx.Input in0 0 1 0 #0=(2,5,8)f32
pnnx.Input in1 0 1 1 #1=(5,5)f32
pnnx.Input in2 0 1 2 #2=(2,5)f32
nn.MultiheadAttention attn 3 1 0 1 2 3 add_bias_kv=False add_zero_attn=False batch_first=True bias=True embed_dim=8 kdim=8 num_heads=2 vdim=8 @in_proj_bias=(24)f32 @in_proj_weight=(24,8)f32 @out_proj.bias=(8)f32 @out_proj.weight=(8,8)f32 $attn_mask=1 $key_padding_mask=2 #0=(2,5,8)f32 #1=(5,5)f32 #2=(2,5)f32 #3=(2,5,8)f32
pnnx.Output out 1 0 3
""")  # noqa: E501


def test_sdpa_becomes_attention(tmp_path):
    g = lower(tmp_path, """
pnnx.Input i0 0 1 0 #0=(1,2,4,8)f32
pnnx.Input i1 0 1 1 #1=(1,2,6,8)f32
pnnx.Input i2 0 1 2 #2=(1,2,6,8)f32
F.scaled_dot_product_attention a 3 1 0 1 2 3 attn_mask=None dropout_p=0.0 is_causal=False scale=0.25 $query=0 $key=1 $value=2
pnnx.Output out 1 0 3
""")  # noqa: E501
    (node,) = g.nodes
    assert node.op_type == "Attention" and node.params == {"scale": 0.25, "is_causal": False}
    q, k, v = (RNG.standard_normal(s).astype(np.float32) for s in ((1, 2, 4, 8), (1, 2, 6, 8), (1, 2, 6, 8)))
    want = np_softmax(q @ k.transpose(0, 1, 3, 2) * 0.25) @ v
    np.testing.assert_allclose(run(g, q, k, v)[0], want, rtol=1e-5, atol=1e-6)


# -- errors ---------------------------------------------------------------------------------------------------------
def test_unknown_type_names_type_node_and_line(tmp_path):
    with pytest.raises(UnsupportedOpError, match=r"m.pnnx.param:4.*torch\.fancy.*'fx'"):
        lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(2,3)f32
torch.fancy fx 1 1 0 1 $input=0
pnnx.Output out 1 0 1
""")  # noqa: E501


def test_malformed_expression_names_file_and_line(tmp_path):
    with pytest.raises(ModelFormatError) as e:
        lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(2,3)f32
pnnx.Expression bad 1 1 0 1 expr=add(@0,
pnnx.Output out 1 0 1
""")  # noqa: E501
    assert e.value.line == 4 and e.value.path.endswith("m.pnnx.param")


def test_pooling_indices_are_dropped_when_unused_and_unsupported_when_used(tmp_path):
    text = """
pnnx.Input in 0 1 0 #0=(1,1,4,4)f32
nn.MaxPool2d mp 1 2 0 1 2 ceil_mode=False dilation=(1,1) kernel_size=(2,2) padding=(0,0) return_indices=True stride=(2,2)
pnnx.Output out {} 0 {}
"""  # noqa: E501
    g = lower(tmp_path, text.format(1, "1"))
    assert ops(g) == ["MaxPool"] and len(g.nodes[0].outputs) == 1
    with pytest.raises(UnsupportedOpError, match="indices"):
        lower(tmp_path, text.format(2, "1 2"))


# -- real exports ---------------------------------------------------------------------------------------------------
def _cases(folder: str) -> list[Path]:
    return sorted(p for p in (FIXTURES / folder).iterdir() if (p / "model.pnnx.param").exists())


@pytest.mark.parametrize("case", _cases("pnnx_lower"), ids=lambda p: p.name)
def test_real_exports_match_torch(case):
    g = lower_pnnx(load_graph(case / "model.pnnx.param"))
    assert not [n for n in g.nodes if n.op_type.startswith("pnnx:")]
    for io_file in sorted(case.glob("io*.npz")):  # io2.npz: a second shape for exports with dynamic dims
        io = np.load(io_file)
        got = run(g, *(io[f"in{i}"] for i in range(len(g.inputs))))
        for i, a in enumerate(got):
            want = io[f"out{i}"]
            assert a.shape == want.shape and a.dtype == want.dtype
            np.testing.assert_allclose(a, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def test_dynamic_multihead_attention_reshapes_without_fixed_dims():
    g = lower_pnnx(load_graph(FIXTURES / "pnnx_lower" / "mha_self_dynamic" / "model.pnnx.param"))
    shapes = [n.params["shape"] for n in g.nodes if n.op_type == "Reshape"]
    assert shapes == [[0, -1, 4, 4]] * 3  # batch and length both dynamic: 0 copies the batch dim


@pytest.mark.parametrize("case", _cases("pnnx"), ids=lambda p: p.name)
def test_model_fixtures_match_torch_node_by_node(case):
    g = lower_pnnx(load_graph(case / "model.pnnx.param"))
    ins, exp = np.load(case / "inputs.npz"), np.load(case / "expected.npz")
    got = run(g, *(ins[v.name] for v in g.inputs))
    for v, a in zip(g.outputs, got, strict=True):
        want = exp[v.name]
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(a, want, rtol=0, atol=1e-4 * scale)


@pytest.mark.parametrize("equation", ["bi,bi->b", "bij,bjk->bik,", "...ij,...jk->...ik", "bhid,bjd->bhij"])
def test_einsum_outside_one_matmul_is_named_unsupported(tmp_path, equation):
    with pytest.raises(UnsupportedOpError, match="equation"):
        lower(tmp_path, f"""
pnnx.Input in 0 1 0 #0=(2,3,4)f32
pnnx.Input in1 0 1 1 #1=(2,3,4)f32
torch.einsum e 2 1 0 1 2 equation={equation}
pnnx.Output out 1 0 2
""")


_RUNTIME_END = """
pnnx.Input in 0 1 0 #0=(2,?)f32
pnnx.Expression e 1 1 0 1 expr={}
Tensor.slice s 2 1 0 1 2 dim=1 start=1 step=1 $input=0 $end=1
pnnx.Output out 1 0 2
"""


def test_slice_bounds_computed_at_run_time_are_slice_inputs(tmp_path):
    import engine

    g = lower(tmp_path, _RUNTIME_END.format("floor_divide(size(@0,1),2)"))
    assert ops(g) == ["Expression", "Slice"]
    sl = g.nodes[1]
    assert sl.inputs[2] is g.nodes[0].outputs[0] and sl.params["axes"] == [1]
    assert sl.inputs[1].const.tolist() == [1] and sl.inputs[3].const.tolist() == [1]
    for n in (9, 6):
        x = RNG.standard_normal((2, n)).astype(np.float32)
        np.testing.assert_array_equal(run(g, x)[0], x[:, 1:n // 2])
    # the runtime: kernels built once at the max shape, then run at smaller shapes with their own bounds
    inst = engine.load(tmp_path / "m.pnnx.param").instance(max_shapes={"in0": (2, 12)})
    for n in (12, 7, 4):
        x = RNG.standard_normal((2, n)).astype(np.float32)
        (y,) = inst.run({"in0": x}).values()
        np.testing.assert_array_equal(y, x[:, 1:n // 2])


def test_slice_multi_dim_run_time_ends_and_known_starts(tmp_path):
    g = lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(?,?,5)f32
pnnx.Expression e 1 1 0 1 expr=[size(@0,0),neg(size(@0,2))]
Tensor.slice s 2 1 0 1 2 dims=(0,2) starts=(1,-4) steps=(1,2) $input=0 $ends=1
pnnx.Output out 1 0 2
""")
    assert ops(g) == ["Expression", "Slice"] and g.nodes[1].params["axes"] == [0, 2]
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(run(g, x)[0], x[1:3, :, -4:-5:2])
    x = RNG.standard_normal((4, 2, 5)).astype(np.float32)
    np.testing.assert_array_equal(run(g, x)[0], x[1:4, :, -4:-5:2])


def test_slice_known_bounds_fold_and_run_time_select_is_unsupported(tmp_path):
    # an input-less expression is a constant: folded into the Slice params
    g = lower(tmp_path, _RUNTIME_END.replace("1 1 0 1 expr", "0 1 1 expr").format("3"))
    assert ops(g) == ["Slice"] and g.nodes[0].params["ends"] == [3] and len(g.nodes[0].inputs) == 1
    with pytest.raises(UnsupportedOpError, match="run-time select"):
        lower(tmp_path, """
pnnx.Input in 0 1 0 #0=(2,?)f32
pnnx.Expression e 1 1 0 1 expr=sub(size(@0,1),1)
Tensor.slice s 2 1 0 1 2 dim=1 $input=0 $select=1
pnnx.Output out 1 0 2
""")


def test_real_export_with_run_time_slices_runs_at_both_shapes():
    import engine

    case = FIXTURES / "pnnx_lower" / "slices_run_time_dynamic"
    ios = [np.load(case / f) for f in ("io.npz", "io2.npz")]
    big = tuple(max(d) for d in zip(*(io["in0"].shape for io in ios), strict=True))
    model = engine.load(case / "model.pnnx.param")
    inst = model.instance(max_shapes={model.inputs[0].name: big})
    for io in ios:
        got = list(inst.run({model.inputs[0].name: io["in0"]}).values())
        assert len(got) == 3
        for i, a in enumerate(got):
            np.testing.assert_array_equal(a, io[f"out{i}"])


@pytest.mark.parametrize("mode, padding, align", [("bilinear", "zeros", "False"), ("nearest", "border", "True")])
def test_grid_sample_maps_to_the_grid_sample_op(tmp_path, mode, padding, align):
    g = lower(tmp_path, f"""
pnnx.Input in0 0 1 x #x=(1,2,4,5)f32
pnnx.Input in1 0 1 g #g=(1,3,3,2)f32
F.grid_sample op 2 1 x g y align_corners={align} mode={mode} padding_mode={padding} $input=x $grid=g #y=(1,2,3,3)f32
pnnx.Output out 1 0 y""")
    (node,) = [n for n in g.nodes if n.op_type == "GridSample"]
    assert node.params == {"mode": mode, "padding_mode": padding, "align_corners": align == "True"}


def test_grid_sample_with_reflection_padding_is_refused(tmp_path):
    with pytest.raises(UnsupportedOpError, match="reflection"):
        lower(tmp_path, """
pnnx.Input in0 0 1 x #x=(1,2,4,5)f32
pnnx.Input in1 0 1 g #g=(1,3,3,2)f32
F.grid_sample op 2 1 x g y align_corners=False mode=bilinear padding_mode=reflection $input=x $grid=g #y=(1,2,3,3)f32
pnnx.Output out 1 0 y""")


def torch_local_response_norm(x, size, alpha, beta, k):
    """torch.nn.functional.local_response_norm's formula: square, pad size // 2 channels before and
    (size - 1) // 2 after with zeros, average over size channels, then x / (k + alpha * avg) ** beta."""
    sq = np.pad(x.astype(np.float64) ** 2, [(0, 0), (size // 2, (size - 1) // 2)] + [(0, 0)] * (x.ndim - 2))
    avg = np.stack([sq[:, c:c + size].sum(1) / size for c in range(x.shape[1])], 1)
    return x / (k + alpha * avg) ** beta


@pytest.mark.parametrize("line, size, alpha, beta, k", [
    ("nn.LocalResponseNorm op 1 1 x y alpha=0.3 beta=0.6 k=1.5 size=3", 3, 0.3, 0.6, 1.5),
    ("F.local_response_norm op 1 1 x y alpha=0.0001 beta=0.75 k=1.0 size=5 $input=x", 5, 1e-4, 0.75, 1.0),
    ("nn.LocalResponseNorm op 1 1 x y alpha=2.0 beta=1.0 k=1.0 size=1", 1, 2.0, 1.0, 1.0)])
def test_local_response_norm_is_torchs_formula(tmp_path, line, size, alpha, beta, k):
    g = lower(tmp_path, f"""
pnnx.Input in0 0 1 x #x=(2,6,3,4)f32
{line} #x=(2,6,3,4)f32 #y=(2,6,3,4)f32
pnnx.Output out 1 0 y""")
    assert ops(g) == ["LRN"]
    x = RNG.standard_normal((2, 6, 3, 4)).astype(np.float32) * 3
    (y,) = run(g, x)
    np.testing.assert_allclose(y, torch_local_response_norm(x, size, alpha, beta, k), rtol=1e-5, atol=1e-6)


def test_local_response_norm_of_an_even_size_is_refused(tmp_path):
    with pytest.raises(UnsupportedOpError, match="size=4"):
        lower(tmp_path, """
pnnx.Input in0 0 1 x #x=(2,6,3,4)f32
nn.LocalResponseNorm op 1 1 x y alpha=0.0001 beta=0.75 k=1.0 size=4 #x=(2,6,3,4)f32 #y=(2,6,3,4)f32
pnnx.Output out 1 0 y""")
