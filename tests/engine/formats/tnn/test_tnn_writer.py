"""The TNN writer: committed TNN fixtures match PyTorch, and PNNX -> IR -> TNN -> IR keeps the outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import engine
from engine.errors import EngineError, UnsupportedOpError
from engine.formats.tnn.tnnmodel import read_model
from engine.formats.tnn.tnnproto import parse_proto
from engine.formats.tnn.writer.write import write_tnn

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
TNN_FIXTURES = sorted(p for p in (FIXTURES / "tnn").iterdir() if p.is_dir())
# Of the output's scale. fp16 fixtures' expected outputs come from PyTorch with the same half-rounded weights
# (tools/make_tnn_fixtures.py), so they are held to the fp32 tolerance.
FP32_TOL = 1e-4


def _max_rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    assert got.shape == ref.shape
    return float(np.abs(got.astype(np.float64) - ref).max()) / max(float(np.abs(ref).max()), 1e-12)


@pytest.mark.parametrize("fixture", TNN_FIXTURES, ids=lambda p: p.name)
def test_committed_tnn_fixture_matches_pytorch(fixture):
    meta = json.loads((fixture / "meta.json").read_text())
    model = engine.load(fixture / "model.tnnproto")
    assert model.format == "tnn" and model.graph.meta["version"] == meta["version"]
    inputs, expected = dict(np.load(fixture / "inputs.npz")), dict(np.load(fixture / "expected.npz"))
    outputs = model.instance().run(inputs)
    assert sorted(outputs) == sorted(expected)
    if meta["fp16"]:
        assert "rounded to half" in meta["reference"], "regenerate with tools/make_tnn_fixtures.py"
    for name, ref in expected.items():
        assert _max_rel_err(outputs[name], ref) < FP32_TOL, name


ROUND_TRIPS = [("misc_conv_resize", 2), ("misc_shapes", 2), ("squeezenet", 1), ("two_inputs", 2),
               ("shufflenet_v2", 1), ("convnext", 2), ("mobilenet_v3", 1), ("misc_activations", 1)]


@pytest.mark.parametrize("name, version", ROUND_TRIPS)
def test_pnnx_round_trip_through_tnn_files(tmp_path, name, version):
    src = FIXTURES / "pnnx" / name
    pnnx_model = engine.load(src / "model.pnnx.param")
    proto, _ = write_tnn(pnnx_model.graph, tmp_path / name, version=version)
    tnn_model = engine.load(proto)
    inputs, expected = dict(np.load(src / "inputs.npz")), dict(np.load(src / "expected.npz"))
    direct, via_tnn = pnnx_model.instance().run(inputs), tnn_model.instance().run(inputs)
    assert [o.name for o in tnn_model.outputs] == [o.name for o in pnnx_model.outputs]
    for key, ref in expected.items():
        assert _max_rel_err(via_tnn[key], ref) < FP32_TOL  # PyTorch is the independent reference
        assert _max_rel_err(via_tnn[key], direct[key]) < 1e-5


def test_written_files_have_the_versions_layout(tmp_path):
    graph = engine.load(FIXTURES / "pnnx" / "squeezenet" / "model.pnnx.param").graph
    for version, fp16 in ((1, False), (2, False), (2, True)):
        proto_path, model_path = write_tnn(graph, tmp_path / f"v{version}{fp16}", version=version, fp16=fp16)
        proto = parse_proto(proto_path)
        assert proto.version == version
        assert [(i.name, i.shape) for i in proto.inputs] == [(v.name, v.shape) for v in graph.inputs]
        assert proto.outputs == [v.name for v in graph.outputs]
        model = read_model(model_path)
        conv = next(r for r in model.resources.values() if r.type == "Convolution")
        assert conv.fields["filter"].code == (1 if fp16 else 0)
        assert (conv.fields["filter"].dims is None) == (version == 1)
    sizes = {p.name: p.stat().st_size for p in tmp_path.glob("*.tnnmodel")}
    assert sizes["v2True.tnnmodel"] < 0.6 * sizes["v2False.tnnmodel"]


def test_fp16_weights_are_rounded_halves(tmp_path):
    graph = engine.load(FIXTURES / "pnnx" / "squeezenet" / "model.pnnx.param").graph
    conv = next(n for n in graph.nodes if n.op_type == "Conv")
    _, model_path = write_tnn(graph, tmp_path / "h", fp16=True)
    stored = next(r for r in read_model(model_path).resources.values() if r.type == "Convolution")
    halves = conv.attrs["weight"].astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(stored.fields["filter"].data, halves)


def test_unsupported_ops_and_v1_limits_name_the_node(tmp_path):
    dynamic = engine.load(FIXTURES / "pnnx" / "dynamic" / "model.pnnx.param").graph
    with pytest.raises(EngineError, match="input_shapes"):  # TNN files record fixed input dims
        write_tnn(dynamic, tmp_path / "d")
    shape = np.load(FIXTURES / "pnnx" / "dynamic" / "inputs.npz")["in0"].shape
    with pytest.raises(UnsupportedOpError, match="Expression"):
        write_tnn(dynamic, tmp_path / "d", input_shapes={"in0": shape})
    transformer = engine.load(FIXTURES / "pnnx" / "transformer" / "model.pnnx.param").graph
    with pytest.raises(UnsupportedOpError, match="constant map") as e:
        write_tnn(transformer, tmp_path / "t", version=1)
    assert "LayerNorm" in str(e.value)
    with pytest.raises(Exception, match="version"):
        write_tnn(transformer, tmp_path / "x", version=3)
