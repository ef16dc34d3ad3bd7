"""PackedAttention: the CPU device turns timm's qkv-reshape-permute-unbind attention into one node reading q, k and
v in place; the model's output matches a plain numpy attention, and chains that differ in any way stay as they
are (and still match)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.devices.cpu.onednn import matmul as dnn
from engine.devices.cpu.onednn import objects as onednn
from engine.devices.cpu.options import CpuOptions
from engine.devices.cpu.packed_attention import pack_attention
from engine.ir import Graph
from engine.passes.infer_shapes import infer_shapes
from engine.runtime.model import Model
from engine.runtime.options import EngineOptions

RNG = np.random.default_rng(3)


def packed_graph(B, T, H, D, perm=(2, 0, 3, 1, 4), order=(0, 1, 2), out_perm=(0, 2, 1, 3), mask=None,
                 causal=False, scale=None, expose=None):
    """y (B, T, H*D) = attention over x (B, T, 3*H*D) split as timm does, with knobs that break the pattern."""
    g = Graph()
    x = g.value("x", (B, T, 3 * H * D), np.float32)
    g.inputs = [x]
    r = g.add_node("Reshape", [x], params={"shape": [B, T, 3, H, D]}).outputs[0]
    p = g.add_node("Transpose", [r], params={"perm": list(perm)}).outputs[0]
    parts = g.add_node("Split", [p], 3, params={"axis": 0, "sizes": [1, 1, 1]}).outputs
    qkv = [g.add_node("Squeeze", [s], params={"axes": [0]}).outputs[0] for s in parts]
    ins = [qkv[i] for i in order]
    if mask is not None:
        ins.append(g.const(mask))
    a = g.add_node("Attention", ins, name="attn", params={"scale": scale, "is_causal": causal}).outputs[0]
    o = g.add_node("Transpose", [a], params={"perm": list(out_perm)}).outputs[0]
    y = g.add_node("Reshape", [o], params={"shape": [B, T, H * D]}).outputs[0]
    y.name = "y"
    g.outputs = [y] + ([{"split": parts[0], "attn": a}[expose]] if expose else [])
    return infer_shapes(g)


def numpy_attention(x, B, T, H, D, perm=(2, 0, 3, 1, 4), order=(0, 1, 2), out_perm=(0, 2, 1, 3), mask=None,
                    causal=False, scale=None):
    p = x.astype(np.float64).reshape(B, T, 3, H, D).transpose(perm)
    q, k, v = (p[i] for i in order)
    s = q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if mask is not None:
        s = s + mask
    if causal:
        s = np.where(np.tri(s.shape[-2], s.shape[-1], dtype=bool), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    out = (e / e.sum(-1, keepdims=True)) @ v
    return out.transpose(out_perm).reshape(B, T, -1)


def run(g: Graph, x: np.ndarray):
    inst = Model(g, "test").instance()
    return inst, inst.run({"x": x})["y"]


@pytest.mark.parametrize("B,T,H,D", [(1, 197, 3, 64), (4, 64, 4, 20), (2, 5, 2, 3), (1, 1500, 2, 8)])
def test_packed_chain_is_one_node_and_matches_numpy(B, T, H, D):
    g = packed_graph(B, T, H, D)
    inst, got = run(g, x := RNG.standard_normal((B, T, 3 * H * D)).astype(np.float32))
    ops = [n.op_type for n in inst.graph.nodes]
    assert "PackedAttention" in ops and not {"Attention", "Split", "Transpose"} & set(ops)
    assert "Attention" in [n.op_type for n in g.nodes]  # the model's own graph is not edited
    np.testing.assert_allclose(got, numpy_attention(x, B, T, H, D), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not onednn.available(), reason="oneDNN is not installed")
@pytest.mark.parametrize("B,T,H,D", [(1, 600, 2, 8), (1, 1030, 2, 8)])
def test_packed_attention_tile_gemms_on_onednn_match_numpy(B, T, H, D, monkeypatch):
    """Over SHORT_KEYS tokens the blocked path's tile GEMMs run on oneDNN (600: one tile of every key; 1030: key
    blocks), reading q, k, v in place in the packed qkv and writing the output through its (B, T, H, D) strides."""
    runs = []
    real = dnn.Runner.run
    monkeypatch.setattr(dnn.Runner, "run", lambda self, *a: (runs.append(1), real(self, *a))[1])
    g = packed_graph(B, T, H, D)
    x = RNG.standard_normal((B, T, 3 * H * D)).astype(np.float32)
    inst = Model(g, "test").instance(options=EngineOptions(cpu=CpuOptions(onednn=True)))
    got = inst.run({"x": x})["y"]
    assert "PackedAttention" in [n.op_type for n in inst.graph.nodes]
    assert runs  # the oneDNN tile path ran, not BLAS
    np.testing.assert_allclose(got, numpy_attention(x, B, T, H, D), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_mask_scale_and_causality_carry_over(causal):
    B, T, H, D = 2, 7, 2, 4
    mask = RNG.standard_normal((T, T)).astype(np.float32)
    g = packed_graph(B, T, H, D, mask=mask, causal=causal, scale=0.3)
    inst, got = run(g, x := RNG.standard_normal((B, T, 3 * H * D)).astype(np.float32))
    assert "PackedAttention" in [n.op_type for n in inst.graph.nodes]
    want = numpy_attention(x, B, T, H, D, mask=mask, causal=causal, scale=0.3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("knob", [
    {"perm": (2, 0, 1, 3, 4)},  # heads and tokens not swapped: q is (B, T, H, D), another attention
    {"order": (1, 0, 2)},  # k first: q and k trade places
    {"out_perm": (0, 1, 2, 3)},  # the output not transposed back
    {"expose": "split"},  # an intermediate is also a graph output
    {"expose": "attn"},
])
def test_other_chains_are_left_alone(knob):
    B, T, H, D = 2, 6, 2, 4
    g = packed_graph(B, T, H, D, **knob)
    assert pack_attention(g) is g
    kw = {k: v for k, v in knob.items() if k != "expose"}
    inst, got = run(g, x := RNG.standard_normal((B, T, 3 * H * D)).astype(np.float32))
    assert "PackedAttention" not in [n.op_type for n in inst.graph.nodes]
    np.testing.assert_allclose(got, numpy_attention(x, B, T, H, D, **kw), rtol=1e-4, atol=1e-5)
