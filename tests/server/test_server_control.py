"""Model control modes (explicit, poll), load/unload on both protocols, load errors, graceful shutdown."""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serverproc import AFFINE_CONFIG, ServerProcess, affine_reference, make_repository

pytestmark = pytest.mark.slow  # each test starts its own server (several seconds each)

X = np.ones((2, 4), np.float32)


def infer_http(srv: ServerProcess, model: str = "affine") -> httpx.Response:
    body = {"inputs": [{"name": "in0", "shape": [2, 4], "datatype": "FP32", "data": X.reshape(-1).tolist()}]}
    return httpx.post(f"http://{srv.http_url}/v2/models/{model}/infer", json=body, timeout=30)


def test_explicit_mode_load_unload(tmp_path):
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG, "other": None})
    srv = ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", "affine")
    try:
        http = httpclient.InferenceServerClient(srv.http_url)
        grpc_client = grpcclient.InferenceServerClient(srv.grpc_url)
        assert http.is_model_ready("affine") and not http.is_model_ready("other")
        index = {m["name"]: m for m in http.get_model_repository_index()}
        assert index["affine"]["state"] == "READY" and "state" not in index["other"]
        r = infer_http(srv, "other")
        assert r.status_code == 404 and "has no available versions" in r.json()["error"]

        grpc_client.load_model("other")
        assert http.is_model_ready("other") and infer_http(srv, "other").status_code == 200
        http.unload_model("affine")
        # Triton's ModelReady: an unloaded model is not ready (ready=false, no error), as its model control example
        # checks; an unknown one likewise; inference names the reason
        assert not grpc_client.is_model_ready("affine") and not http.is_model_ready("affine")
        assert not grpc_client.is_model_ready("never-there")
        assert grpc_client.is_server_ready()  # an explicit unload does not make the server unready
        assert infer_http(srv, "affine").status_code == 404
        http.load_model("affine")
        np.testing.assert_allclose(np.array(infer_http(srv).json()["outputs"][0]["data"]).reshape(2, 3),
                                   affine_reference(X)["out0"], rtol=1e-5, atol=1e-6)
        http.unload_model("missing")  # Triton 2.51: unloading a model the repository lacks succeeds
        assert "missing" not in {m["name"] for m in http.get_model_repository_index()}
        # a load with a config override (the JSON form of config.pbtxt) replaces the served config atomically
        override = json.dumps({"name": "other", "max_batch_size": 2, "dynamic_batching": {}})
        grpc_client.load_model("other", config=override)
        assert http.get_model_config("other")["max_batch_size"] == 2
        r = infer_http(srv, "other")
        assert r.status_code == 200 and r.json()["outputs"][0]["shape"] == [2, 3]
    finally:
        assert srv.stop() == 0, srv.log_text


def test_load_errors_name_the_field(tmp_path):
    bad = AFFINE_CONFIG.replace('dims: [ 4 ]', 'dims: [ 5 ]')
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG, "bad": bad, "gpu": AFFINE_CONFIG.replace(
        "KIND_CPU", "KIND_GPU"), "syntax": "max_batch_size: [oops"})
    srv = ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", "affine")
    try:
        http = httpclient.InferenceServerClient(srv.http_url)
        for model, words in (("bad", "input[0].dims [5]"), ("gpu", "KIND_GPU"), ("syntax", "config.pbtxt:1")):
            r = httpx.post(f"http://{srv.http_url}/v2/repository/models/{model}/load")
            assert r.status_code == 400 and words in r.json()["error"], r.text
        index = {m["name"]: m for m in http.get_model_repository_index()}
        assert index["bad"]["state"] == "UNAVAILABLE" and "dims" in index["bad"]["reason"]
        assert http.is_server_live()
    finally:
        srv.stop()


def test_exit_on_error_at_startup(tmp_path):
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG.replace('"in0"', '"nope"')})
    srv = ServerProcess(repo, expect_ready=False)
    assert srv.proc.wait(60) == 1
    assert "'nope' is not a model input" in srv.log_text


def test_poll_mode_reloads_new_version_without_failing_requests(tmp_path):
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG})
    srv = ServerProcess(repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.5")
    failures: list[str] = []
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            r = infer_http(srv)
            if r.status_code != 200:
                failures.append(r.text)

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    try:
        for t in threads:
            t.start()
        shutil.copytree(repo / "affine" / "1", repo / "affine" / "2")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            meta = httpx.get(f"http://{srv.http_url}/v2/models/affine").json()
            if meta.get("versions") == ["2"]:
                break
            time.sleep(0.2)
        assert meta["versions"] == ["2"]
        assert infer_http(srv).json()["model_version"] == "2"
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == []
    try:  # removing the model directory unloads the model
        shutil.rmtree(repo / "affine")
        deadline = time.monotonic() + 30
        while httpx.get(f"http://{srv.http_url}/v2/models/affine/ready").status_code == 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert httpx.post(f"http://{srv.http_url}/v2/repository/index", json={}).json() == []
    finally:
        srv.stop()


def test_sigterm_fails_readiness_then_drains(tmp_path):
    config = AFFINE_CONFIG.replace("max_queue_delay_microseconds: 20000", "max_queue_delay_microseconds: 1500000")
    repo = make_repository(tmp_path / "repo", {"affine": config})
    # a drain long enough that the readiness probe below lands inside it on a loaded machine
    srv = ServerProcess(repo, "--drain-delay-secs", "3")
    results: list[int] = []
    t = threading.Thread(target=lambda: results.append(infer_http(srv).status_code))
    t.start()
    deadline = time.monotonic() + 20
    while "nv_inference_pending_request_count{model=\"affine\",version=\"1\"} 1.0" not in httpx.get(
            srv.metrics_url).text:  # wait until the request sits in the batcher's queue (1.5 s delay)
        assert time.monotonic() < deadline
        time.sleep(0.02)
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    assert httpx.get(f"http://{srv.http_url}/v2/health/ready").status_code == 503
    t.join(30)
    assert results == [200]  # the queued request still got its answer
    assert srv.proc.wait(30) == 0


def model_series(srv: ServerProcess, model: str) -> list[str]:
    """The /metrics sample lines labelled with `model`."""
    text = httpx.get(srv.metrics_url, timeout=30).text
    return [line for line in text.splitlines() if not line.startswith("#") and f'model="{model}"' in line]


def wait_until(condition, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_an_unloaded_model_leaves_no_metric_series(tmp_path):
    """As in Triton (a model's metric reporter removes its series when the model goes): after an unload through the
    repository API, and after a poll finds a version or the model gone, /metrics holds none of its series (counters,
    gauges, histograms); loaded again, its counters start from 0."""
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG, "other": AFFINE_CONFIG})
    srv = ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", "*")
    try:
        assert infer_http(srv).status_code == 200 and infer_http(srv, "other").status_code == 200
        kinds = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_pending_request_count",
                 "nv_model_load_duration_secs", "nnserve_arena_bytes", "nnserve_request_duration_seconds_count")
        series = model_series(srv, "affine")
        assert all(any(line.startswith(k + "{") for line in series) for k in kinds), series
        httpclient.InferenceServerClient(srv.http_url).unload_model("affine")
        assert model_series(srv, "affine") == []
        assert model_series(srv, "other") != []  # the other model's series stay
        httpclient.InferenceServerClient(srv.http_url).load_model("affine")
        assert 'nv_inference_request_success{model="affine",version="1"} 0.0' in model_series(srv, "affine")
    finally:
        assert srv.stop() == 0, srv.log_text

    repo = make_repository(tmp_path / "polled", {"affine": AFFINE_CONFIG})
    srv = ServerProcess(repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.5")
    try:
        assert infer_http(srv).status_code == 200
        assert any('version="1"' in line for line in model_series(srv, "affine"))
        shutil.copytree(repo / "affine" / "1", repo / "affine" / "2")  # the latest version only: 1 goes
        wait_until(lambda: not any('version="1"' in line for line in model_series(srv, "affine")),
                   "version 1's series removed")
        assert infer_http(srv).json()["model_version"] == "2"
        shutil.rmtree(repo / "affine")
        wait_until(lambda: model_series(srv, "affine") == [], "the removed model's series removed")
    finally:
        assert srv.stop() == 0, srv.log_text
