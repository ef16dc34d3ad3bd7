"""An int8 model made by `nnserve quantize` serves like any other: its config auto-completed by `nnserve import`, REST
and gRPC answers equal to the engine's own run of the file (and close to PyTorch's float outputs), the dynamic
batcher, and metrics.

TNN files fix their input shapes, so, like every TNN model (ultraface_tnn included), an int8 one takes batches of
the size its file records: the dynamic batcher queues and schedules its requests one batch of 1 at a time."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serverproc import ServerProcess, nnserve_command, sample

import engine
from engine.quantize import QuantizeOptions, quantize

REPO = Path(__file__).resolve().parents[2]
SMALLNET = REPO / "docs" / "smallnet"
BATCHED = """
name: "smallnet_int8_batched"
backend: "tnn"
max_batch_size: 1
input [ { name: "in0" data_type: TYPE_FP32 dims: [ 3, 64, 64 ] } ]
output [ { name: "out0" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
instance_group [ { count: 2 kind: KIND_CPU } ]
"""
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def int8_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("int8_repo")
    rng = np.random.default_rng(9)
    x = np.load(SMALLNET / "input.npy")
    samples = [{"in0": x[:1]}, {"in0": x[1:]}] + [
        {"in0": (x[:1] + rng.standard_normal(x[:1].shape) * 0.1).astype(np.float32)} for _ in range(4)]
    result = quantize(SMALLNET / "smallnet.pnnx.param", samples, root / "int8", QuantizeOptions(report_samples=0))
    imported = subprocess.run([*nnserve_command(), "import", str(result.proto), "--repository", str(root), "--name",
                               "smallnet_int8"], capture_output=True, text=True, timeout=300)
    assert imported.returncode == 0, imported.stderr
    batched = root / "smallnet_int8_batched"
    (batched / "1").mkdir(parents=True)
    (batched / "1" / "model.tnnproto").write_bytes(result.proto.read_bytes())
    (batched / "1" / "model.tnnmodel").write_bytes(result.model.read_bytes())
    (batched / "config.pbtxt").write_text(BATCHED)
    server = ServerProcess(root)
    try:
        yield server, result.proto
    finally:
        server.stop()


def test_auto_completed_config(int8_server):
    server, _ = int8_server
    config = httpx.get(f"http://{server.http_url}/v2/models/smallnet_int8/config").json()
    assert config["backend"] == "tnn" and config["max_batch_size"] == 1
    assert config["input"][0]["dims"] == [3, 64, 64] and config["output"][0]["dims"] == [10]


def test_rest_and_grpc_answer_as_the_engine(int8_server):
    server, proto = int8_server
    x = np.load(SMALLNET / "input.npy")[:1]
    want = engine.load(proto).instance().run({"in0": x})["out0"]
    torch_fp32 = np.load(SMALLNET / "expected.npy")[:1]
    cos = float(np.dot(want.ravel(), torch_fp32.ravel()) / np.linalg.norm(want) / np.linalg.norm(torch_fp32))
    assert cos >= 0.99
    http = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("in0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(http.infer("smallnet_int8", [inp]).as_numpy("out0"), want)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    ginp = grpcclient.InferInput("in0", list(x.shape), "FP32")
    ginp.set_data_from_numpy(x)
    np.testing.assert_array_equal(grpc.infer("smallnet_int8", [ginp]).as_numpy("out0"), want)


def test_dynamic_batcher_and_metrics(int8_server):
    server, proto = int8_server
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((1, 3, 64, 64)).astype(np.float32) for _ in range(16)]
    inst = engine.load(proto).instance()
    wants = [inst.run({"in0": x})["out0"] for x in xs]

    def infer(x):
        client = httpclient.InferenceServerClient(server.http_url)
        inp = httpclient.InferInput("in0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer("smallnet_int8_batched", [inp]).as_numpy("out0")

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(infer, xs))
    for g, w in zip(got, wants, strict=True):
        np.testing.assert_array_equal(g, w)
    text = httpx.get(server.metrics_url).text
    model = "smallnet_int8_batched"
    assert sample(text, "nv_inference_count", model=model) == 16
    assert sample(text, "nv_inference_exec_count", model=model) == 16  # the file fixes batch 1
    assert sample(text, "nv_inference_request_success", model=model) == 16
    arena = sample(text, "nnserve_arena_bytes", model=model, instance="0", device="cpu")
    plan = inst.memory_plan
    assert arena == plan.arena_bytes + plan.workspace_bytes
    fp32 = engine.load(SMALLNET / "smallnet.pnnx.param").instance(max_shapes={"in0": (1, 3, 64, 64)}).memory_plan
    assert plan.arena_bytes < fp32.arena_bytes  # int8 activations


def test_a_nan_input_is_refused_not_quantized(int8_server):
    """int8 has no NaN: the engine's quantization gave 0 for it (a NaN pixel served the clean image's logits). The
    server refuses it per request, before batching, with Triton's 400; other requests, and infinities (which
    saturate, as in TNN), are served."""
    server, proto = int8_server
    x = np.load(SMALLNET / "input.npy")[:1].copy()
    model = engine.load(proto)
    assert model.quantized_inputs == ["in0"]
    want = model.instance().run({"in0": x})["out0"]
    bad = x.copy()
    bad[0, 1, 2, 3] = np.nan
    for name in ("smallnet_int8", "smallnet_int8_batched"):
        body = json.dumps({"inputs": [  # NaN written as such (Python's json; httpx's own refuses it)
            {"name": "in0", "shape": list(bad.shape), "datatype": "FP32", "data": bad.ravel().tolist()}]})
        r = httpx.post(f"http://{server.http_url}/v2/models/{name}/infer", content=body,
                       headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "holds NaN" in r.json()["error"] and "int8" in r.json()["error"], r.text
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    ginp = grpcclient.InferInput("in0", list(bad.shape), "FP32")
    ginp.set_data_from_numpy(bad)
    with pytest.raises(Exception, match="holds NaN"):
        grpc.infer("smallnet_int8", [ginp])
    http = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("in0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(http.infer("smallnet_int8_batched", [inp]).as_numpy("out0"), want)
    inf = x.copy()
    inf[0, 0, 0, 0] = np.inf
    inp.set_data_from_numpy(inf)
    assert np.isfinite(http.infer("smallnet_int8", [inp]).as_numpy("out0")).all()
