"""REST end to end: `nnserve serve` in a subprocess driven by tritonclient.http and raw httpx."""

from __future__ import annotations

import json
import struct

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from serverproc import affine_reference
from tritonclient.utils import InferenceServerException

X = np.arange(12, dtype=np.float32).reshape(3, 4) / 7 - 0.8


def url(server, path: str) -> str:
    return f"http://{server.http_url}{path}"


def test_health_and_server_metadata(server):
    assert httpx.get(url(server, "/v2/health/live")).status_code == 200
    assert httpx.get(url(server, "/v2/health/ready")).status_code == 200
    meta = httpx.get(url(server, "/v2")).json()
    assert meta["name"] == "nnserve" and "binary_tensor_data" in meta["extensions"]
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("affine") and client.is_model_ready("affine", "1")
    assert not client.is_model_ready("affine", "7")
    # Triton's HTTP front end: a model that is not ready (unknown here: the core's ModelIsReady says not ready, no
    # error) is 400 "Model version not ready"
    r = httpx.get(url(server, "/v2/models/nope/ready"))
    assert r.status_code == 400 and r.json()["error"] == "Model version not ready"


def test_model_metadata_and_config(server):
    client = httpclient.InferenceServerClient(server.http_url)
    meta = client.get_model_metadata("affine")
    assert meta["versions"] == ["1"] and meta["platform"] == "pnnx"
    assert meta["inputs"] == [{"name": "in0", "datatype": "FP32", "shape": [-1, 4]}]
    assert [o["name"] for o in meta["outputs"]] == ["out0", "out1"]
    config = client.get_model_config("affine")
    assert config["max_batch_size"] == 8 and config["input"][0]["dims"] == [4]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 20000
    assert httpx.get(url(server, "/v2/models/affine/versions/1")).json() == meta


def test_auto_completed_config(server):
    """affine_auto has no config.pbtxt: inputs, outputs and max_batch_size come from the model file."""
    config = httpx.get(url(server, "/v2/models/affine_auto/config")).json()
    assert config["max_batch_size"] == 4  # Triton's default-max-batch-size
    assert config["backend"] == "pnnx"
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("in0", "TYPE_FP32", [4])]
    assert [t["name"] for t in config["output"]] == ["out0", "out1"]
    assert "dynamic_batching" not in config  # so it runs one request per execution
    body = {"inputs": [{"name": "in0", "shape": [4, 4], "datatype": "FP32", "data": X[:1].repeat(4, 0).tolist()}]}
    r = httpx.post(url(server, "/v2/models/affine_auto/infer"), json=body)
    out = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}
    np.testing.assert_allclose(out["out1"], affine_reference(X[:1].repeat(4, 0))["out1"], rtol=1e-5, atol=1e-6)
    stats = httpx.get(url(server, "/v2/models/affine_auto/versions/1/stats")).json()["model_stats"][0]
    assert stats["batch_stats"][0]["batch_size"] == 4 and stats["inference_count"] == stats["execution_count"] * 4


def test_json_infer_matches_numpy(server):
    body = {"id": "req-1", "inputs": [{"name": "in0", "shape": [3, 4], "datatype": "FP32",
                                       "data": X.tolist()}]}
    r = httpx.post(url(server, "/v2/models/affine/infer"), json=body)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["id"] == "req-1" and doc["model_name"] == "affine" and doc["model_version"] == "1"
    ref = affine_reference(X)
    for out in doc["outputs"]:
        assert out["shape"] == [3, 3] and out["datatype"] == "FP32"
        np.testing.assert_allclose(np.array(out["data"]).reshape(3, 3), ref[out["name"]], rtol=1e-5, atol=1e-6)


def test_binary_infer_with_tritonclient(server):
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("in0", list(X.shape), "FP32")
    inp.set_data_from_numpy(X, binary_data=True)
    outs = [httpclient.InferRequestedOutput("out1", binary_data=True)]
    result = client.infer("affine", [inp], outputs=outs)
    np.testing.assert_allclose(result.as_numpy("out1"), affine_reference(X)["out1"], rtol=1e-5, atol=1e-6)
    assert result.as_numpy("out0") is None  # only the requested output comes back


def test_raw_binary_body_layout(server):
    """The binary extension by hand: JSON header, then the tensor bytes; the response mixes JSON and binary."""
    header = json.dumps({"inputs": [{"name": "in0", "shape": [3, 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": X.nbytes}}],
                         "outputs": [{"name": "out0", "parameters": {"binary_data": True}},
                                     {"name": "out1", "parameters": {"binary_data": False}}]}).encode()
    r = httpx.post(url(server, "/v2/models/affine/infer"), content=header + X.tobytes(),
                   headers={"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 200, r.text
    n = int(r.headers["Inference-Header-Content-Length"])
    doc = json.loads(r.content[:n])
    out0 = next(o for o in doc["outputs"] if o["name"] == "out0")
    assert out0["parameters"]["binary_data_size"] == 36
    np.testing.assert_allclose(np.frombuffer(r.content[n:], "<f4").reshape(3, 3), affine_reference(X)["out0"],
                               rtol=1e-5, atol=1e-6)
    assert "data" in next(o for o in doc["outputs"] if o["name"] == "out1")


def error_of(server, body: dict, model: str = "affine") -> tuple[int, str]:
    r = httpx.post(url(server, f"/v2/models/{model}/infer"), json=body)
    return r.status_code, r.json()["error"]


@pytest.mark.parametrize("inputs, status, words", [
    ([{"name": "in0", "shape": [2, 5], "datatype": "FP32", "data": [0.0] * 10}], 400, "unexpected shape"),
    ([{"name": "in0", "shape": [3, 4], "datatype": "FP64", "data": [0.0] * 12}], 400, "data-type is 'FP64'"),
    ([{"name": "in0", "shape": [1, 4], "datatype": "BYTES", "data": ["a", "b", "c", "d"]}], 400, "'BYTES'"),
    ([], 400, "missing required input"),
    ([{"name": "in9", "shape": [1, 4], "datatype": "FP32", "data": [0.0] * 4}], 400, "unexpected inference input"),
    ([{"name": "in0", "shape": [9, 4], "datatype": "FP32", "data": [0.0] * 36}], 400, "batch-size must be <= 8"),
    ([{"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": [0.0] * 3}], 400, "needs 4"),
])
def test_infer_errors(server, inputs, status, words):
    code, message = error_of(server, {"inputs": inputs})
    assert code == status and words in message


def test_unknown_model_and_malformed_body(server):
    code, message = error_of(server, {"inputs": []}, model="nope")
    assert code == 404 and "Request for unknown model: 'nope' is not found" in message  # Triton 2.51
    r = httpx.post(url(server, "/v2/models/affine/infer"), content=b"{not json")
    assert r.status_code == 400 and "JSON" in r.json()["error"]
    r = httpx.get(url(server, "/v2/models/affine/versions/3"))
    assert r.status_code == 404 and "version 3" in r.json()["error"]
    with pytest.raises(InferenceServerException, match="unknown model"):
        httpclient.InferenceServerClient(server.http_url).get_model_metadata("nope")


def test_statistics_count_inferences(server):
    before = httpx.get(url(server, "/v2/models/affine/stats")).json()["model_stats"][0]
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("in0", [2, 4], "FP32")
    inp.set_data_from_numpy(X[:2])
    client.infer("affine", [inp])
    stats = client.get_inference_statistics("affine")["model_stats"][0]
    assert stats["inference_count"] == before["inference_count"] + 2
    assert stats["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 1
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert stats["inference_stats"][phase]["ns"] > before["inference_stats"][phase]["ns"] or phase == "queue"
    assert any(b["batch_size"] == 2 for b in stats["batch_stats"])
    assert httpx.get(url(server, "/v2/models/stats")).status_code == 200


def test_repository_index_and_control_disabled(server):
    index = httpx.post(url(server, "/v2/repository/index"), json={}).json()
    assert {(m["name"], m["state"]) for m in index} == {("affine", "READY"), ("affine_auto", "READY")}
    r = httpx.post(url(server, "/v2/repository/models/affine/unload"))
    assert r.status_code == 400 and "model control" in r.json()["error"]


def test_bytes_wire_format_is_rejected_cleanly_in_binary(server):
    """A BYTES tensor in binary form (4-byte length prefixes) decodes, then fails the datatype check."""
    raw = b"".join(struct.pack("<I", len(s)) + s for s in (b"ab", b"", b"xyz", b"q"))
    header = json.dumps({"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(raw)}}]}).encode()
    r = httpx.post(url(server, "/v2/models/affine/infer"), content=header + raw,
                   headers={"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 400 and "expects 'FP32'" in r.json()["error"]


@pytest.mark.parametrize("request_enc, response_enc", [("gzip", "deflate"), ("deflate", "gzip")])
def test_compressed_bodies_with_tritonclient(server, request_enc, response_enc):
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("in0", list(X.shape), "FP32")
    inp.set_data_from_numpy(X, binary_data=True)
    result = client.infer("affine", [inp], request_compression_algorithm=request_enc,
                          response_compression_algorithm=response_enc)
    np.testing.assert_allclose(result.as_numpy("out0"), affine_reference(X)["out0"], rtol=1e-5, atol=1e-6)
    r = httpx.post(url(server, "/v2/models/affine/infer"), content=b"not gzip",
                   headers={"Content-Encoding": "gzip"})
    assert r.status_code == 400 and "not valid gzip" in r.json()["error"]
    r = httpx.post(url(server, "/v2/models/affine/infer"), content=b"{}", headers={"Content-Encoding": "br"})
    assert r.status_code == 501


@pytest.mark.parametrize("method, path, status, words", [
    ("GET", "/v2/nothing/here", 404, "no such endpoint: GET /v2/nothing/here"),
    ("POST", "/v3/models/affine/infer", 404, "no such endpoint: POST /v3/models/affine/infer"),
    ("GET", "/v2/models/affine/infer", 405, "method GET is not allowed for /v2/models/affine/infer; allowed: POST"),
    ("DELETE", "/v2/health/live", 405, "method DELETE is not allowed for /v2/health/live"),
])
def test_unknown_routes_and_methods_answer_kserve_errors(server, method, path, status, words):
    r = httpx.request(method, url(server, path))
    assert r.status_code == status and r.json() == {"error": r.json()["error"]}, r.text
    assert words in r.json()["error"]
    if status == 405:
        assert "GET" in r.headers["allow"] or "POST" in r.headers["allow"]


def test_per_op_profile_of_a_served_model(server):
    """POST .../profile {"action": "start"} times every node of the model's instances over the requests that follow;
    GET answers the table so far (per op kind and per node, with the kernel that ran each), "stop" ends it."""
    base = url(server, "/v2/models/affine/profile")
    assert httpx.get(base).json()["profiling"] is False
    started = httpx.post(base, json={"action": "start"})
    assert started.status_code == 200 and started.json()["runs"] == 0
    body = {"inputs": [{"name": "in0", "shape": [3, 4], "datatype": "FP32", "data": X.tolist()}]}
    for _ in range(3):  # one after the other: three executions
        assert httpx.post(url(server, "/v2/models/affine/infer"), json=body).status_code == 200
    doc = httpx.get(url(server, "/v2/models/affine/versions/1/profile")).json()
    assert doc["profiling"] is True and doc["runs"] == 3 and doc["fallback_nodes"] == []
    assert {o["op"] for o in doc["ops"]} and all(o["ms_per_run"] >= 0 for o in doc["ops"])
    assert all(n["calls"] == 3 and n["kernel"] for n in doc["nodes"])
    assert sum(o["nodes"] for o in doc["ops"]) == len(doc["nodes"])
    assert doc["table"].startswith("profile: 3 run(s)")
    stopped = httpx.post(base, json={"action": "stop"}).json()
    assert stopped["profiling"] is False and stopped["runs"] == 3
    assert httpx.get(base).json() == {"name": "affine", "version": "1", "profiling": False}
    bad = httpx.post(base, json={"action": "pause"})
    assert bad.status_code == 400 and "start" in bad.json()["error"]
    assert httpx.post(base, content=b"[1]").status_code == 400
    assert httpx.get(url(server, "/v2/models/nope/profile")).status_code in (400, 404)
