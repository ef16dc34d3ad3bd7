"""fuse_attention: softmax(q·kᵀ·scale + mask)·v written out as ops (timm's, Hugging Face's eager, Swin's and
EfficientFormer's code after lowering) becomes one Attention node; the loaded model then matches plain numpy
(float64, the softmax of a row of -inf being NaN as torch gives it). Chains it must not fuse stay as they are."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import engine
from engine.ir import Graph
from engine.runtime.loading import prepare
from engine.runtime.model import Model

rng = np.random.default_rng(19)
N, H, L, S, D = 2, 3, 5, 7, 4


def _x(*shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def softmax_attention(q, kt, v, scale, mask=None):
    s = np.matmul(q.astype(np.float64), kt.astype(np.float64)) * scale
    if mask is not None:
        s = s + mask
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
    return np.matmul(p, v.astype(np.float64))


class Builder:
    """A canonical graph built op by op; `feeds` holds the inputs' values."""

    def __init__(self):
        self.g = Graph(meta={"format": "canonical"})
        self.feeds: dict[str, np.ndarray] = {}

    def input(self, name: str, a: np.ndarray):
        v = self.g.value(name, a.shape, a.dtype)
        self.g.inputs.append(v)
        self.feeds[name] = a
        return v

    def op(self, op_type: str, *inputs, **params):
        ins = [self.g.const(np.asarray(x, np.float32)) if not hasattr(x, "consumers") else x for x in inputs]
        return self.g.add_node(op_type, ins, params=params).outputs[0]

    def model(self, *outputs) -> Model:
        self.g.outputs = list(outputs)
        return Model(prepare(self.g))


def run(model: Model, feeds: dict) -> list[np.ndarray]:
    out = model.instance("cpu").run(feeds)
    return [out[v.name] for v in model.graph.outputs]


def attention_nodes(model: Model):
    return [n for n in model.graph.nodes if n.op_type == "Attention"]


def test_timm_style_q_scaled_first():
    b = Builder()
    q, k, v = b.input("q", _x(N, H, L, D)), b.input("k", _x(N, H, S, D)), b.input("v", _x(N, H, S, D))
    qs = b.op("Mul", q, 0.5)
    s = b.op("MatMul", qs, b.op("Transpose", k, perm=[0, 1, 3, 2]))
    y = b.op("MatMul", b.op("Softmax", s, axis=-1), v)
    model = b.model(y)
    assert model.op_counts() == {"Attention": 1}
    (att,) = attention_nodes(model)
    assert att.params == {"scale": 0.5, "is_causal": False, "masked_rows": "nan"}
    want = softmax_attention(b.feeds["q"], b.feeds["k"].swapaxes(-1, -2), b.feeds["v"], 0.5)
    np.testing.assert_allclose(run(model, b.feeds)[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mask_first", [False, True])
def test_hugging_face_eager_with_padding_mask_and_dead_rows(mask_first):
    """(q kᵀ) / sqrt(d) + mask, softmax on axis 3; rows whose every key is masked are NaN as in torch."""
    b = Builder()
    q, k, v = b.input("q", _x(N, H, L, D)), b.input("k", _x(N, H, S, D)), b.input("v", _x(N, H, S, D))
    m = np.where(rng.random((N, 1, L, S)) > 0.3, 0.0, -np.inf).astype(np.float32)
    m[1, 0, 2] = -np.inf
    mask = b.input("mask", m)
    s = b.op("Div", b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2])), 2.0)
    s = b.op("Add", mask, s) if mask_first else b.op("Add", s, mask)
    y = b.op("MatMul", b.op("Softmax", s, axis=3), v)
    model = b.model(y)
    assert model.op_counts() == {"Attention": 1}
    (att,) = attention_nodes(model)
    assert att.inputs[3].name == "mask" and att.params["scale"] == 0.5
    got = run(model, b.feeds)[0]
    want = softmax_attention(b.feeds["q"], b.feeds["k"].swapaxes(-1, -2), b.feeds["v"], 0.5, m)
    assert np.isnan(got[1, :, 2]).all() and np.isnan(want[1, :, 2]).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_keys_permuted_from_tokens_major():
    """kᵀ = k.permute(0, 2, 3, 1) of (N, S, H, D) keys: one Transpose to (N, H, S, D) feeds the Attention."""
    b = Builder()
    q, k, v = b.input("q", _x(N, H, L, D)), b.input("k", _x(N, S, H, D)), b.input("v", _x(N, H, S, D))
    s = b.op("MatMul", q, b.op("Transpose", k, perm=[0, 2, 3, 1]))
    y = b.op("MatMul", b.op("Softmax", b.op("Mul", s, 0.25), axis=-1), v)
    model = b.model(y)
    assert model.op_counts() == {"Attention": 1, "Transpose": 1}
    (t,) = [n for n in model.graph.nodes if n.op_type == "Transpose"]
    assert t.params["perm"] == [0, 2, 1, 3]
    want = softmax_attention(b.feeds["q"], b.feeds["k"].transpose(0, 2, 3, 1), b.feeds["v"], 0.25)
    np.testing.assert_allclose(run(model, b.feeds)[0], want, rtol=1e-5, atol=1e-6)


def test_keys_given_transposed():
    b = Builder()
    q, kt, v = b.input("q", _x(N, L, D)), b.input("kt", _x(N, D, S)), b.input("v", _x(N, S, D))
    y = b.op("MatMul", b.op("Softmax", b.op("MatMul", q, kt), axis=-1), v)
    model = b.model(y)
    assert model.op_counts() == {"Attention": 1, "Transpose": 1}
    want = softmax_attention(b.feeds["q"], b.feeds["kt"], b.feeds["v"], 1.0)
    np.testing.assert_allclose(run(model, b.feeds)[0], want, rtol=1e-5, atol=1e-6)


def test_relative_position_bias_of_windowed_attention():
    """Swin / EfficientFormer: a constant (H, N, N) bias added to the scores of every window."""
    b = Builder()
    windows, tokens = 4, 9
    q, k, v = (b.input(n, _x(windows, H, tokens, D)) for n in "qkv")
    bias = _x(H, tokens, tokens)
    s = b.op("Add", b.op("MatMul", b.op("Mul", q, 0.5), b.op("Transpose", k, perm=[0, 1, 3, 2])), bias)
    y = b.op("MatMul", b.op("Softmax", s, axis=-1), v)
    model = b.model(y)
    assert model.op_counts() == {"Attention": 1}
    want = softmax_attention(b.feeds["q"], b.feeds["k"].swapaxes(-1, -2), b.feeds["v"], 0.5, bias)
    np.testing.assert_allclose(run(model, b.feeds)[0], want, rtol=1e-5, atol=1e-6)


def _unfusable(case: str) -> tuple[Builder, list]:
    b = Builder()
    q, k, v = b.input("q", _x(1, H, L, D)), b.input("k", _x(1, H, S, D)), b.input("v", _x(1, H, S, D))
    s = b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2]))
    if case == "weights-returned":
        p = b.op("Softmax", s, axis=-1)
        return b, [b.op("MatMul", p, v), p]
    if case == "scores-reused":
        return b, [b.op("MatMul", b.op("Softmax", s, axis=-1), v), b.op("Relu", s)]
    if case == "softmax-not-last":
        return b, [b.op("MatMul", b.op("Softmax", s, axis=-2), b.input("v2", _x(1, H, L, D)))]
    if case == "mask-widens-scores":
        s = b.op("Add", s, b.input("mask", _x(2, H, L, S)))
        return b, [b.op("MatMul", b.op("Softmax", s, axis=-1), v)]
    assert case == "tensor-scale"
    s = b.op("Mul", s, b.input("t", _x(1, H, L, 1)))
    return b, [b.op("MatMul", b.op("Softmax", s, axis=-1), v)]


@pytest.mark.parametrize("case", ["weights-returned", "scores-reused", "softmax-not-last", "mask-widens-scores",
                                  "tensor-scale"])
def test_chains_that_are_not_attention_stay_unfused(case):
    b, outputs = _unfusable(case)
    model = b.model(*outputs)
    assert "Attention" not in model.op_counts()
    assert model.op_counts()["Softmax"] == 1


PNNX_EXPORTS = Path(__file__).resolve().parents[2] / "fixtures" / "pnnx_lower"


@pytest.mark.parametrize("case", ["attention_timm", "attention_hf_eager", "attention_windows"])
def test_real_pnnx_exports_fuse(case):
    """timm's Attention, Hugging Face's eager self-attention (with its padding mask) and Swin's window attention
    as pnnx exports them (tools/make_lower_pnnx_fixtures.py): one Attention node each, torch's outputs."""
    model = engine.load(PNNX_EXPORTS / case / "model.pnnx.param")
    counts = model.op_counts()
    assert counts.get("Attention") == 1 and "Softmax" not in counts and "MatMul" not in counts, counts
    io = np.load(PNNX_EXPORTS / case / "io.npz")
    out = model.instance("cpu").run({s.name: io[f"in{i}"] for i, s in enumerate(model.inputs)})
    np.testing.assert_allclose(out[model.outputs[0].name], io["out0"], rtol=1e-4, atol=1e-5)
