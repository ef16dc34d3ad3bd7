"""The trace and logging extensions on the real server: Triton's setting shapes over HTTP and gRPC, the trace file
(Triton's JSON: one head object and one object per activity timestamp, per trace) with its rate, count and
log_frequency, per-model settings that mirror the global ones, and log settings that change the log as it runs."""

from __future__ import annotations

import json
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serverproc import AFFINE_CONFIG, ServerProcess, make_repository, nnserve_command

from server import tracing
from server.tracing import ACTIVITIES

X = np.array([[0.5, -1.0, 2.0, 1.5]], np.float32)


def infer(srv: ServerProcess, model: str = "affine", request_id: str = "") -> None:
    body = {"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": X.ravel().tolist()}]}
    if request_id:
        body["id"] = request_id
    r = httpx.post(f"http://{srv.http_url}/v2/models/{model}/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text


def traces_in(path: Path) -> dict[int, list[dict]]:
    """The trace file's objects grouped by trace id."""
    grouped: dict[int, list[dict]] = {}
    for obj in json.loads(path.read_text()):
        grouped.setdefault(obj["id"], []).append(obj)
    return grouped


def check_trace(objects: list[dict], model: str, request_id: str = "") -> None:
    head, *stamps = objects
    assert head["model_name"] == model and head["model_version"] == 1
    assert head.get("request_id", "") == request_id
    names = [s["timestamps"][0]["name"] for s in stamps]
    assert names == list(ACTIVITIES)
    times = [s["timestamps"][0]["ns"] for s in stamps]
    assert times == sorted(times) and times[0] > 0


def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert path.exists(), path


@pytest.fixture
def traced(tmp_path):
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG, "other": AFFINE_CONFIG})
    trace = tmp_path / "trace.json"
    srv = ServerProcess(repo, "--trace-config", f"triton,file={trace}", "--trace-config", "level=TIMESTAMPS",
                        "--trace-config", "rate=1", "--trace-config", "log_frequency=2")
    yield srv, trace
    srv.stop()


def test_trace_settings_and_files(traced):
    srv, trace = traced
    url = f"http://{srv.http_url}"
    assert httpx.get(f"{url}/v2/trace/setting", timeout=10).json() == {
        "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1", "log_frequency": "2",
        "trace_file": str(trace), "trace_mode": "triton"}
    for i in range(4):
        infer(srv, request_id=f"req{i}")
    for index in (0, 1):  # every 2 traces a file of their own
        wait_for(Path(f"{trace}.{index}"))
        grouped = traces_in(Path(f"{trace}.{index}"))
        assert len(grouped) == 2
        for objects in grouped.values():
            check_trace(objects, "affine", objects[0]["request_id"])

    # the rate: one request in 3 from now on (a new setting counts afresh)
    r = httpx.post(f"{url}/v2/trace/setting", json={"trace_rate": "3", "log_frequency": "1"}, timeout=10)
    assert r.status_code == 200 and r.json()["trace_rate"] == "3" and r.json()["log_frequency"] == "1"
    for _ in range(6):
        infer(srv)
    wait_for(Path(f"{trace}.3"))
    assert not Path(f"{trace}.4").exists()

    # per model: its own level, the other fields mirror the global ones, and clearing returns to them
    other = f"{url}/v2/models/other/trace/setting"
    r = httpx.post(other, json={"trace_level": ["OFF"]}, timeout=10)
    assert r.json()["trace_level"] == ["OFF"] and r.json()["trace_rate"] == "3"
    httpx.post(f"{url}/v2/trace/setting", json={"trace_rate": "1"}, timeout=10)
    assert httpx.get(other, timeout=10).json()["trace_rate"] == "1"  # mirrored
    for _ in range(3):
        infer(srv, "other")
    assert not Path(f"{trace}.4").exists()
    r = httpx.post(other, json={"trace_level": None}, timeout=10)
    assert r.json()["trace_level"] == ["TIMESTAMPS"]

    # count: two more traces, then none until the count is set again
    httpx.post(f"{url}/v2/trace/setting", json={"trace_count": "2"}, timeout=10)
    for _ in range(4):
        infer(srv)
    wait_for(Path(f"{trace}.5"))
    assert httpx.get(f"{url}/v2/trace/setting", timeout=10).json()["trace_count"] == "0"
    assert not Path(f"{trace}.6").exists()


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"trace_file": "/tmp/elsewhere.json"}, 501, "trace file location can not be updated through network protocol"),
    ({"trace_rate": "x"}, 400, "Unable to parse 'trace_rate', got: x"),
    ({"trace_rate": "99999999999"}, 400, "out of range"),
    ({"trace_count": "-2"}, 400, "Expecting value >= -1"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, 400, "Expect only one trace level 'OFF' is specified"),
    ({"trace_rate": "0", "trace_level": ["TIMESTAMPS"]}, 400,
     "Attempting to set invalid trace setting :sample rate must be non-zero"),
    # the session server has no trace file (--trace-config file=...): tracing cannot be turned on over the network
    ({"trace_level": ["TIMESTAMPS"]}, 400, "Attempting to set invalid trace setting :trace file name is not given"),
])
def test_trace_setting_errors(server, body, status, words):
    r = httpx.post(f"http://{server.http_url}/v2/trace/setting", json=body, timeout=10)
    assert r.status_code == status and words in r.json()["error"], r.text
    assert httpx.get(f"http://{server.http_url}/v2/trace/setting", timeout=10).json()["trace_level"] == ["OFF"]


def test_trace_over_grpc_and_unknown_models(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    settings = client.get_trace_settings(as_json=True)["settings"]
    assert settings["trace_level"]["value"] == ["OFF"] and settings["trace_rate"]["value"] == ["1000"]
    updated = client.update_trace_settings("affine", {"trace_count": "5"}, as_json=True)["settings"]
    assert updated["trace_count"]["value"] == ["5"]
    assert client.get_trace_settings(as_json=True)["settings"]["trace_count"]["value"] == ["-1"]
    cleared = client.update_trace_settings("affine", {"trace_count": None}, as_json=True)["settings"]
    assert cleared["trace_count"]["value"] == ["-1"]
    r = httpx.get(f"http://{server.http_url}/v2/models/nope/trace/setting", timeout=10)
    assert r.status_code == 404 and r.json()["error"] == "Request for unknown model: 'nope' is not found"


def test_traces_are_written_at_shutdown(tmp_path):
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG})
    trace = tmp_path / "trace.json"
    srv = ServerProcess(repo, "--trace-config", f"file={trace}", "--trace-config", "level=TIMESTAMPS",
                        "--trace-config", "rate=1")
    try:
        for _ in range(3):
            infer(srv)
        grpcclient.InferenceServerClient(srv.grpc_url).infer("affine", [_grpc_input()])
    finally:
        assert srv.stop() == 0, srv.log_text
    grouped = traces_in(trace)
    assert len(grouped) == 4
    for objects in grouped.values():
        check_trace(objects, "affine")


def _grpc_input() -> grpcclient.InferInput:
    inp = grpcclient.InferInput("in0", [1, 4], "FP32")
    inp.set_data_from_numpy(X)
    return inp


def test_trace_config_errors_stop_the_server(tmp_path):
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG})
    cases = (("mode=zipkin", "unknown mode 'zipkin'"),
             ("level=TIMESTAMPS", "trace file name is not given"),
             ("colour=blue", "unknown setting 'colour'"),
             ("opentelemetry,url=ftp://collector:21/v1/traces", "only http:// and https://"),
             ("opentelemetry,bsp_max_export_batch_size=4096", "must not exceed bsp_max_queue_size"),
             ("opentelemetry,bsp_schedule_delay=0", "bsp_schedule_delay must be within"),
             ("opentelemetry,resource=service.name", "expected opentelemetry,resource=<key>=<value>"),
             ("opentelemetry,headers=a", "unknown OpenTelemetry setting 'headers'"))

    def serve(spec: str) -> subprocess.CompletedProcess:
        return subprocess.run([*nnserve_command(), "serve", "--model-repository", str(repo), "--trace-config", spec],
                              capture_output=True, text=True, timeout=60)

    # Each server stops before it binds a port or loads a model: independent processes, started a few at once
    # (each spends seconds importing the server, which is mostly waiting on the disk and the other core).
    with ThreadPoolExecutor(4) as pool:
        procs = list(pool.map(serve, [spec for spec, _ in cases]))
    for (spec, words), proc in zip(cases, procs, strict=True):
        assert proc.returncode != 0 and words in proc.stderr, (spec, proc.stderr)


# ---- logging ---------------------------------------------------------------------------------------------------
def test_log_settings(tmp_path):
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG})
    srv = ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", "affine")
    url = f"http://{srv.http_url}/v2/logging"
    try:
        assert httpx.get(url, timeout=10).json() == {
            "log_file": "", "log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0,
            "log_format": "default"}
        sentinel = 1234.5  # exact in float32
        body = {"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": [sentinel, 0, 0, 0]}]}
        infer_url = f"http://{srv.http_url}/v2/models/affine/infer"
        httpx.post(infer_url, json=body, timeout=30)
        assert httpx.post(url, json={"log_verbose_level": 2}, timeout=10).json()["log_verbose_level"] == 2
        httpx.post(infer_url, json=body, timeout=30)
        wait_for_log(srv, "1234.5")
        httpx.post(url, json={"log_verbose_level": 0}, timeout=10)

        r = httpx.post(url, json={"log_info": False}, timeout=10)
        assert r.json()["log_info"] is False
        httpclient.InferenceServerClient(srv.http_url).load_model("affine")
        httpx.post(url, json={"log_info": True, "log_format": "ISO8601"}, timeout=10)
        grpcclient.InferenceServerClient(srv.grpc_url).load_model("affine")
        wait_for_log(srv, "loaded model 'affine'", count=2)
        loads = [line for line in srv.log if "loading model 'affine'" in line]
        assert len(loads) == 2  # the start-up load and the last one; the one with log_info off said nothing
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ INFO ", loads[-1]), loads[-1]

        for body, status, words in (({"log_file": "/tmp/x.log"}, 501, "log file location can not be updated"),
                                    ({"log_format": "bogus"}, 400, "invalid argument for log_format, got: bogus"),
                                    ({"log_info": "yes"}, 400, "expect boolean for 'log_info'"),
                                    ({"log_verbose_level": -1}, 400, "log_verbose_level")):
            r = httpx.post(url, json=body, timeout=10)
            assert r.status_code == status and words in r.json()["error"], r.text

        client = grpcclient.InferenceServerClient(srv.grpc_url)
        settings = client.update_log_settings({"log_verbose_level": 1, "log_format": "default"}, as_json=True)
        assert settings["settings"]["log_verbose_level"] == {"uint32_param": 1}
        assert settings["settings"]["log_format"] == {"string_param": "default"}
        assert client.get_log_settings(as_json=True)["settings"]["log_info"] == {"bool_param": True}
    finally:
        assert srv.stop() == 0, srv.log_text
    assert sum("1234.5" in line for line in srv.log) == 1  # logged at level 2 only


def wait_for_log(srv: ServerProcess, words: str, count: int = 1, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while sum(words in line for line in srv.log) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sum(words in line for line in srv.log) >= count, srv.log_text[-2000:]


# ---- the shutdown write's buffer is bounded ------------------------------------------------------------------------
def trace_ids(path: Path) -> list[int]:
    return sorted({o["id"] for o in json.loads(path.read_text())})


def take_traces(tracer: tracing.Tracer, n: int) -> None:
    for i in range(n):
        trace = tracer.sample("m", "1", f"r{i}")
        assert trace is not None
        trace.stamp("REQUEST_START", i)
        trace.finish()


def test_unlimited_traces_written_at_shutdown_are_flushed_past_a_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(tracing, "MAX_BUFFERED_TRACES", 5)
    path = tmp_path / "trace.json"
    tracer = tracing.Tracer(tracing.TraceConfig(level="TIMESTAMPS", rate=1, count=-1, log_frequency=0,
                                                file=str(path)))
    take_traces(tracer, 12)
    # two full buffers went to indexed files, as log_frequency 5 would have written them; two wait for shutdown
    first, second = (trace_ids(tmp_path / f"trace.json.{i}") for i in (0, 1))
    start = first[0]  # trace ids count on across the process
    assert first == list(range(start, start + 5)) and second == list(range(start + 5, start + 10))
    assert not path.exists() and not (tmp_path / "trace.json.2").exists()
    tracer.close()
    assert trace_ids(path) == [start + 10, start + 11]


def test_the_trace_buffer_is_bounded_in_bytes_too(tmp_path, monkeypatch):
    monkeypatch.setattr(tracing, "MAX_BUFFERED_BYTES", 1000)
    path = tmp_path / "trace.json"
    tracer = tracing.Tracer(tracing.TraceConfig(level="TIMESTAMPS", rate=1, count=-1, log_frequency=0,
                                                file=str(path)))
    take_traces(tracer, 40)  # ~110 bytes each
    written = sorted(tmp_path.glob("trace.json.*"))
    assert written and all(f.stat().st_size <= 1000 + 200 for f in written)
    tracer.close()
    everything = sorted(i for f in [*written, path] for i in trace_ids(f))
    assert everything == list(range(everything[0], everything[0] + 40))  # none lost, none twice


def test_traces_kept_across_setting_updates_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(tracing, "MAX_BUFFERED_TRACES", 3)
    file = tracing.TraceFile(str(tmp_path / "t.json"))
    file.save(['{"id":1}', '{"id":2}'], indexed=False)  # a retired setting's traces, kept for shutdown
    assert not list(tmp_path.iterdir())
    file.save(['{"id":3}'], indexed=False)
    assert trace_ids(tmp_path / "t.json.0") == [1, 2, 3]
    file.close()
    assert not (tmp_path / "t.json").exists()
