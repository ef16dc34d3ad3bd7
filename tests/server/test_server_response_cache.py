"""The response cache (`response_cache { enable: true }` with --cache-config local,size=N): a repeated request is
answered without running the model, with Triton's statistics (cache_hit / cache_miss) and metrics (nv_cache_*);
the cache's key and its size limit directly."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tracemalloc

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from pymodels import copy_models, ensemble, python_model
from serverproc import AFFINE_CONFIG, ServerProcess, affine_reference, make_repository, nnserve_command

from server.response_cache import ResponseCache, outputs_bytes, request_key

X = np.array([[0.5, -1.0, 2.0, 1.5], [1.0, 0.0, -0.5, 3.0]], np.float32)
CACHED = AFFINE_CONFIG + "response_cache { enable: true }\n"


def infer(srv: ServerProcess, model: str, x: np.ndarray) -> dict:
    body = {"inputs": [{"name": "in0", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    r = httpx.post(f"http://{srv.http_url}/v2/models/{model}/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in r.json()["outputs"]}


def stats(srv: ServerProcess, model: str) -> dict:
    return httpx.get(f"http://{srv.http_url}/v2/models/{model}/stats", timeout=10).json()["model_stats"][0]


def metric(srv: ServerProcess, name: str, model: str) -> float:
    for line in httpx.get(srv.metrics_url, timeout=10).text.splitlines():
        if line.startswith(f'{name}{{model="{model}",version="1"}}'):
            return float(line.split()[-1])
    return 0.0


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    repo = make_repository(tmp_path_factory.mktemp("cacherepo"), {"cached": CACHED, "plain": AFFINE_CONFIG})
    server = ServerProcess(repo, "--cache-config", "local,size=1048576")
    yield server
    assert server.stop() == 0, server.log_text


def test_a_repeated_request_is_answered_from_the_cache(srv):
    expected = affine_reference(X)
    for _ in range(3):
        got = infer(srv, "cached", X)
        for name in ("out0", "out1"):
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6)
    s = stats(srv, "cached")
    phases = s["inference_stats"]
    assert phases["cache_miss"]["count"] == 1 and phases["cache_hit"]["count"] == 2
    assert phases["success"]["count"] == 3 and phases["cache_hit"]["ns"] > 0
    assert s["execution_count"] == 1 and s["inference_count"] == 2  # the model ran once, for the miss
    assert metric(srv, "nv_cache_num_hits_per_model", "cached") == 2
    assert metric(srv, "nv_cache_num_misses_per_model", "cached") == 1
    assert metric(srv, "nv_inference_request_success", "cached") == 3
    assert metric(srv, "nv_inference_exec_count", "cached") == 1

    # other inputs are another entry; a model without response_cache never uses the cache
    other = X + 1
    np.testing.assert_allclose(infer(srv, "cached", other)["out0"], affine_reference(other)["out0"], rtol=1e-5,
                               atol=1e-6)
    assert stats(srv, "cached")["inference_stats"]["cache_miss"]["count"] == 2
    for _ in range(2):
        infer(srv, "plain", X)
    plain = stats(srv, "plain")
    assert plain["execution_count"] >= 1 and plain["inference_stats"]["cache_hit"]["count"] == 0
    assert plain["inference_stats"]["cache_miss"]["count"] == 0


def test_grpc_hits_the_same_entries(srv):
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    x = X * 3
    inp = grpcclient.InferInput("in0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    before = stats(srv, "cached")["inference_stats"]["cache_hit"]["count"]
    first = client.infer("cached", [inp]).as_numpy("out1")
    second = client.infer("cached", [inp]).as_numpy("out1")
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(second, affine_reference(x)["out1"], rtol=1e-5, atol=1e-6)
    assert stats(srv, "cached")["inference_stats"]["cache_hit"]["count"] == before + 1
    assert infer(srv, "cached", x)["out1"].shape == (2, 3)  # and HTTP finds gRPC's entry
    assert stats(srv, "cached")["inference_stats"]["cache_hit"]["count"] == before + 2


def test_without_a_server_cache_every_request_runs(tmp_path):
    repo = make_repository(tmp_path / "repo", {"cached": CACHED})
    srv = ServerProcess(repo)
    try:
        for _ in range(2):
            infer(srv, "cached", X)
        s = stats(srv, "cached")
        assert s["inference_stats"]["cache_hit"]["count"] == 0 and s["inference_count"] == 4
    finally:
        assert srv.stop() == 0, srv.log_text
    assert "model 'cached' enables response_cache, but the server has no cache" in srv.log_text


@pytest.mark.parametrize(("flag", "words"), [("redis,host=x", "only the 'local' cache"),
                                             ("local,size=0", "must be positive"),
                                             ("local,bytes=10", "expected local,size=BYTES")])
def test_cache_config_errors(tmp_path, flag, words):
    proc = subprocess.run([*nnserve_command(), "serve", "--model-repository", str(tmp_path), "--cache-config",
                           flag], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and words in proc.stderr


# ---- the cache itself ------------------------------------------------------------------------------------------
def test_keys_cover_names_datatypes_shapes_and_bytes():
    a = {"x": np.arange(4, dtype=np.float32)}
    key = request_key("m", "1", a)
    assert key == request_key("m", "1", {"x": np.arange(4, dtype=np.float32)})
    assert key != request_key("m", "2", a)
    assert key != request_key("n", "1", a)
    assert key != request_key("m", "1", {"y": a["x"]})
    assert key != request_key("m", "1", {"x": a["x"].reshape(2, 2)})
    assert key != request_key("m", "1", {"x": a["x"].view(np.int32)})
    words = {"s": np.array([b"ab", b"c"], np.object_)}
    assert request_key("m", "1", words) != request_key("m", "1", {"s": np.array([b"a", b"bc"], np.object_)})


def test_least_recently_used_entries_go_first():
    cache = ResponseCache(max_bytes=100)
    entry = {"y": np.zeros(10, np.float32)}  # 40 bytes
    assert cache.put(b"a", entry) and cache.put(b"b", entry)
    assert cache.get(b"a") is not None  # a is now the most recent
    assert cache.put(b"c", entry)
    assert cache.get(b"b") is None and cache.get(b"a") is not None and cache.get(b"c") is not None
    assert cache.used_bytes == 80 and cache.evictions == 1
    assert not cache.put(b"big", {"y": np.zeros(26, np.float32)})  # larger than the whole cache
    stored = cache.get(b"a")["y"]
    assert not stored.flags.writeable


# ---- what a Python model sees besides its inputs ---------------------------------------------------------------
# Answers only the outputs asked for (all three when none is named), P being the request's parameter `scale`.
ECHO_CONFIG = """
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "O32" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "OF16" data_type: TYPE_FP16 dims: [ 2 ] },
         { name: "P" data_type: TYPE_INT32 dims: [ 1 ] } ]
response_cache { enable: true }
"""
ECHO_SOURCE = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            scale = int(json.loads(request.parameters()).get("scale", 1))
            wanted = request.requested_output_names() or ["O32", "OF16", "P"]
            made = {"O32": x, "OF16": x.astype(np.float16), "P": np.array([scale], np.int32)}
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(n, made[n]) for n in wanted]))
        return responses
"""


def echo(srv: ServerProcess, outputs: list[str] | None = None, **parameters) -> dict:
    body: dict = {"inputs": [{"name": "IN", "shape": [2], "datatype": "FP32", "data": [1.5, -2.0]}]}
    if outputs is not None:
        body["outputs"] = [{"name": n} for n in outputs]
    if parameters:
        body["parameters"] = parameters
    r = httpx.post(f"http://{srv.http_url}/v2/models/echo/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return {o["name"]: o["data"] for o in r.json()["outputs"]}


def test_a_python_models_entries_depend_on_the_outputs_asked_for_and_the_parameters(tmp_path):
    python_model(tmp_path, "echo", ECHO_CONFIG, ECHO_SOURCE)
    srv = ServerProcess(tmp_path, "--cache-config", "local,size=1048576")
    try:
        assert echo(srv, ["O32"]) == {"O32": [1.5, -2.0]}
        assert echo(srv, ["OF16", "P"]) == {"OF16": [1.5, -2.0], "P": [1]}  # not the first one's entry
        assert echo(srv) == {"O32": [1.5, -2.0], "OF16": [1.5, -2.0], "P": [1]}
        assert echo(srv, ["P"], scale=1) == {"P": [1]}
        assert echo(srv, ["P"], scale=5) == {"P": [5]}
        assert echo(srv, ["P"], scale=5, priority=1, binary_data_output=False) == {"P": [5]}  # the front end's: a hit
        assert echo(srv, ["O32"]) == {"O32": [1.5, -2.0]}  # a hit
        phases = stats(srv, "echo")["inference_stats"]
        assert phases["cache_miss"]["count"] == 5 and phases["cache_hit"]["count"] == 2
    finally:
        assert srv.stop() == 0, srv.log_text


def test_keys_cover_the_outputs_and_parameters_given():
    a = {"x": np.arange(4, dtype=np.float32)}
    key = request_key("m", "1", a, ["o1", "o2"], {"scale": 1})
    assert key == request_key("m", "1", a, ["o2", "o1"], {"scale": 1})
    assert key != request_key("m", "1", a, ["o1"], {"scale": 1})
    assert key != request_key("m", "1", a, ["o1", "o2"], {"scale": 5})
    assert key != request_key("m", "1", a, ["o1", "o2"], {"scale": True})  # a bool is not the int 1
    assert key != request_key("m", "1", a, ["o1", "o2"], {"scale": "1"})
    assert request_key("m", "1", a) == request_key("m", "1", a, [], {})
    # the loaded copies that answer: a reload, or an ensemble step's new version, is another key
    assert request_key("m", "1", a, copies=[3, 4]) != request_key("m", "1", a, copies=[3, 5])
    assert request_key("m", "1", a, copies=[3, 4]) != request_key("m", "1", a, copies=[3])


# ---- configs Triton refuses --------------------------------------------------------------------------------------
SEQUENCE_CACHED = """
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching { }
response_cache { enable: true }
"""
DECOUPLED_CACHED = """
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
response_cache { enable: true }
"""
IDENTITY_SOURCE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                            .as_numpy())]) for r in requests]
"""


def test_a_cached_sequence_or_decoupled_model_is_refused_at_load(tmp_path):
    python_model(tmp_path, "seq", SEQUENCE_CACHED, IDENTITY_SOURCE)
    python_model(tmp_path, "dec", DECOUPLED_CACHED, IDENTITY_SOURCE)
    srv = ServerProcess(tmp_path, "--cache-config", "local,size=1048576", "--exit-on-error", "false",
                        "--strict-readiness", "false")
    try:
        index = {m["name"]: m for m in httpx.post(f"http://{srv.http_url}/v2/repository/index", json={},
                                                   timeout=10).json()}
        assert index["seq"]["state"] == "UNAVAILABLE" and index["dec"]["state"] == "UNAVAILABLE"
        assert index["seq"]["reason"] == ("Response Cache does not currently support model seq with sequence "
                                          "batching scheduler. Please disable the response cache.")
        assert index["dec"]["reason"] == ("Response Cache does not currently support model dec with 'decoupled' "
                                          "transaction policy. Please disable the response cache.")
    finally:
        assert srv.stop() == 0, srv.log_text


# ---- what an entry costs ------------------------------------------------------------------------------------------
def test_bytes_entries_are_counted_at_what_they_cost_in_memory():
    words = np.array([b"%06d" % i for i in range(20_000)], np.object_)
    assert outputs_bytes({"s": words}) == words.nbytes + sum(sys.getsizeof(w) for w in words)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        made = np.array([b"%06d" % i for i in range(20_000)], np.object_)  # its objects and its pointers
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert outputs_bytes({"s": made}) >= 0.9 * held  # the memory they hold, not the 14 bytes per element of text
    cache = ResponseCache(max_bytes=outputs_bytes({"s": made}) + 100)
    assert cache.put(b"a", {"s": made}) and not cache.put(b"b", {"s": np.concatenate([made, made])})


ENSEMBLE_OVER_SEQUENCE = """
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "simple_sequence" model_version: -1 input_map { key: "INPUT" value: "IN" }
                               output_map { key: "OUTPUT" value: "OUT" } } ] }
response_cache { enable: true }
"""


def test_a_request_of_a_sequence_is_never_answered_from_the_cache(tmp_path):
    """A cached ensemble whose step keeps a sequence's state: START, then two more requests with the same input,
    must give what the stateful model gives (6, 5, 5: START adds 1), not the first answer replayed."""
    copy_models(tmp_path, "simple_sequence")
    ensemble(tmp_path, "ens", ENSEMBLE_OVER_SEQUENCE)
    srv = ServerProcess(tmp_path, "--cache-config", "local,size=1048576")
    try:
        answers = []
        for params in ({"sequence_id": 11, "sequence_start": True}, {"sequence_id": 11},
                       {"sequence_id": 11, "sequence_end": True}):
            body = {"parameters": params,
                    "inputs": [{"name": "IN", "datatype": "INT32", "shape": [1, 1], "data": [5]}]}
            r = httpx.post(f"http://{srv.http_url}/v2/models/ens/infer", json=body, timeout=30)
            assert r.status_code == 200, r.text
            answers.append(r.json()["outputs"][0]["data"])
        assert answers == [[6], [5], [5]]
    finally:
        assert srv.stop() == 0, srv.log_text


# A Python model answering OUT = IN * FACTOR, FACTOR written into its source.
TIMES_CONFIG = """
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
response_cache { enable: true }
"""
TIMES_SOURCE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                            .as_numpy() * FACTOR)]) for r in requests]
"""
ENSEMBLE_OVER_TIMES = """
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "times" model_version: -1 input_map { key: "IN" value: "IN" }
                               output_map { key: "OUT" value: "OUT" } } ] }
response_cache { enable: true }
"""


def times(srv: ServerProcess, model: str) -> list[int]:
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1, 1], "data": [7]}]}
    r = httpx.post(f"http://{srv.http_url}/v2/models/{model}/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["outputs"][0]["data"]


def test_a_reloaded_model_or_a_steps_new_version_is_not_answered_from_old_entries(tmp_path):
    """The cache's entries belong to the loaded copies that answered: a cached model reloaded from changed files,
    and a cached ensemble whose step model was reloaded or got a newer version (the step asks for the newest), give
    the new model's answers, then hit the cache again."""
    python_model(tmp_path, "times", TIMES_CONFIG, TIMES_SOURCE.replace("FACTOR", "2"))
    ensemble(tmp_path, "ens", ENSEMBLE_OVER_TIMES)
    srv = ServerProcess(tmp_path, "--cache-config", "local,size=1048576", "--model-control-mode", "explicit",
                        "--load-model", "*")
    try:
        assert times(srv, "times") == [14] and times(srv, "ens") == [14]
        assert times(srv, "times") == [14] and times(srv, "ens") == [14]  # hits
        (tmp_path / "times" / "1" / "model.py").write_text(textwrap.dedent(TIMES_SOURCE.replace("FACTOR", "3")))
        r = httpx.post(f"http://{srv.http_url}/v2/repository/models/times/load", timeout=120)
        assert r.status_code == 200, r.text
        assert times(srv, "times") == [21] and times(srv, "ens") == [21]
        python_model(tmp_path, "times", TIMES_CONFIG, TIMES_SOURCE.replace("FACTOR", "5"), version="2")
        r = httpx.post(f"http://{srv.http_url}/v2/repository/models/times/load", timeout=120)
        assert r.status_code == 200, r.text
        assert times(srv, "ens") == [35] and times(srv, "ens") == [35]
        ens = stats(srv, "ens")["inference_stats"]
        assert ens["cache_miss"]["count"] == 3 and ens["cache_hit"]["count"] == 2
    finally:
        assert srv.stop() == 0, srv.log_text
