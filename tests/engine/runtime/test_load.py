"""engine.load: format dispatch, specs, op counts, and one error naming every unsupported op."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.errors import EngineError, UnsupportedOpError
from engine.formats.pnnx.writer import write_pnnx
from engine.ir import Graph
from engine.runtime.model import Model

PARAM = """7767517
5 5
pnnx.Input               pnnx_input_0             0 1 0 #0=(?,4)f32
nn.Linear                fc                       1 1 0 1 bias=True in_features=4 out_features=3 \
@bias=(3)f32 @weight=(3,4)f32 #0=(?,4)f32 #1=(?,3)f32
{a:<24} act_a                    1 1 1 2 #1=(?,3)f32 #2=(?,3)f32
{b:<24} act_b                    1 1 2 3 #2=(?,3)f32 #3=(?,3)f32
pnnx.Output              pnnx_output_0            1 0 3 #3=(?,3)f32
"""
W = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
B = np.array([0.5, -1.0, 0.0], np.float32)


def write(tmp_path, a="nn.ReLU", b="nn.Sigmoid"):
    return write_pnnx(tmp_path / "m.pnnx.param", PARAM.format(a=a, b=b), {"fc.weight": W, "fc.bias": B})


def test_load_gives_specs_op_counts_and_runs(tmp_path):
    model = engine.load(write(tmp_path))
    (i,), (o,) = model.inputs, model.outputs
    assert (i.shape, i.datatype, o.shape, o.datatype) == ((-1, 4), "FP32", (-1, 3), "FP32")
    assert model.op_counts() == {"Gemm": 1, "Sigmoid": 1}  # relu fused into the Gemm epilogue
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    y = model.instance(max_shapes={i.name: (4, 4)}).run({i.name: x})[o.name]
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-np.maximum(x @ W.T + B, 0))), rtol=1e-6)


def test_every_unsupported_op_is_named_at_once(tmp_path):
    with pytest.raises(UnsupportedOpError) as e:
        engine.load(write(tmp_path, a="nn.Frobnicate", b="nn.Wobble"))
    msg = str(e.value)
    assert "nn.Frobnicate" in msg and "nn.Wobble" in msg
    assert "m.pnnx.param:5" in msg and "m.pnnx.param:6" in msg  # line 1 is the magic number


def test_unknown_extension_names_the_supported_ones(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"")
    with pytest.raises(EngineError, match=r"supported: MODEL\.pnnx\.param, MODEL\.tnnproto"):
        engine.load(tmp_path / "model.onnx")
    with pytest.raises(EngineError, match="no such model file"):
        engine.load(tmp_path / "absent.pnnx.param")


def test_quantized_inputs_are_those_an_int8_quantization_is_reached_from():
    # the server refuses a NaN in them per request (server/dataplane.py), so a float layer in between must count
    g = Graph()
    a, b, c = (g.value(n, (1, 4), np.float32) for n in ("a", "b", "c"))
    g.inputs = [a, b, c]
    t = g.add_node("Transpose", [a], params={"perm": [1, 0]}).outputs[0]
    q = g.add_node("TnnQuantize", [t], attrs={"scale": np.ones(1, np.float32)}).outputs[0]
    s = g.add_node("Add", [b, b]).outputs[0]
    g.outputs = [q, s, c]
    assert Model(g).quantized_inputs == ["a"]
