"""Triton's OpenTelemetry trace mode on the real server: sampled requests reach an OTLP/HTTP collector (a plain
HTTP server here, reading the JSON encoding as the OTLP specification defines it) as Triton's three spans per
request: InferRequest, the model span with its attributes, and compute, linked parent to child, with the
activities as events on the real-time clock. A collector that is absent costs requests nothing."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from serverproc import AFFINE_CONFIG, ServerProcess, make_repository

from server.otlp_export import parse_traceparent

X = np.array([[0.5, -1.0, 2.0, 1.5]], np.float32)
HEX32, HEX16 = re.compile(r"^[0-9a-f]{32}$"), re.compile(r"^[0-9a-f]{16}$")


class Collector:
    """Records every POSTed export body; answers as an OTLP/HTTP receiver does (200, an empty JSON response)."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.paths: list[str] = []
        self.content_types: list[str] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                size = int(self.headers["Content-Length"])
                collector.paths.append(self.path)
                collector.content_types.append(self.headers["Content-Type"])
                collector.bodies.append(json.loads(self.rfile.read(size)))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def spans(self) -> list[tuple[dict, dict]]:
        """(resource, span) of everything received."""
        return [(rs["resource"], span) for body in self.bodies for rs in body["resourceSpans"]
                for ss in rs["scopeSpans"] for span in ss["spans"]]

    def wait_for(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.spans()) < count:
            assert time.monotonic() < deadline, f"spans received: {self.spans()}"
            time.sleep(0.05)

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


def _attributes(span: dict) -> dict:
    out = {}
    for a in span["attributes"]:
        (kind, value), = a["value"].items()
        out[a["key"]] = int(value) if kind == "intValue" else value
    return out


def test_spans_reach_the_collector_as_triton_makes_them(tmp_path, collector):
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG})
    srv = ServerProcess(repo, "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
                        "--trace-config", "rate=1", "--trace-config",
                        f"opentelemetry,url=127.0.0.1:{collector.port}/v1/traces", "--trace-config",
                        "opentelemetry,resource=service.name=nnserve-test", "--trace-config",
                        "opentelemetry,resource=deployment=ci", "--trace-config", "opentelemetry,bsp_schedule_delay=50")
    t_before = time.time_ns()
    try:
        setting = httpx.get(f"http://{srv.http_url}/v2/trace/setting", timeout=30).json()
        assert setting["trace_mode"] == "opentelemetry" and setting["trace_level"] == ["TIMESTAMPS"]
        body = {"id": "r-http", "inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32",
                                            "data": X.ravel().tolist()}]}
        assert httpx.post(f"http://{srv.http_url}/v2/models/affine/infer", json=body, timeout=30).status_code == 200
        inp = grpcclient.InferInput("in0", [1, 4], "FP32")
        inp.set_data_from_numpy(X)
        grpcclient.InferenceServerClient(srv.grpc_url).infer("affine", [inp], request_id="r-grpc")
        collector.wait_for(6)
    finally:
        assert srv.stop() == 0, srv.log_text
    t_after = time.time_ns()
    assert set(collector.paths) == {"/v1/traces"} and set(collector.content_types) == {"application/json"}
    by_trace: dict[str, list[tuple[dict, dict]]] = {}
    for resource, span in collector.spans():
        by_trace.setdefault(span["traceId"], []).append((resource, span))
    assert len(by_trace) == 2
    request_ids = set()
    for trace_id, items in by_trace.items():
        assert HEX32.match(trace_id)
        resource = _attributes(items[0][0])
        assert resource == {"service.name": "nnserve-test", "deployment": "ci"}
        spans = {span["name"]: span for _, span in items}
        assert set(spans) == {"InferRequest", "affine", "compute"}
        root, model, compute = spans["InferRequest"], spans["affine"], spans["compute"]
        for span in spans.values():
            assert HEX16.match(span["spanId"])
            start, end = int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"])
            assert t_before - 10**9 <= start <= end <= t_after + 10**9  # the real-time clock
            times = [int(e["timeUnixNano"]) for e in span["events"]]
            assert times == sorted(times) and all(start <= t <= end for t in times)
        assert "parentSpanId" not in root
        assert model["parentSpanId"] == root["spanId"] and compute["parentSpanId"] == model["spanId"]
        assert [e["name"] for e in model["events"]] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
        assert [e["name"] for e in compute["events"]] == ["COMPUTE_START", "COMPUTE_INPUT_END",
                                                          "COMPUTE_OUTPUT_START", "COMPUTE_END"]
        attributes = _attributes(model)
        assert attributes["triton.model_name"] == "affine" and attributes["triton.model_version"] == 1
        assert attributes["triton.trace_id"] > 0
        request_ids.add(attributes["triton.request_id"])
    assert request_ids == {"r-http", "r-grpc"}


def test_an_absent_collector_costs_requests_nothing(tmp_path):
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG})
    probe = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = probe.server_address[1]
    probe.server_close()  # a port nothing listens on
    srv = ServerProcess(repo, "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
                        "--trace-config", "rate=1", "--trace-config", f"opentelemetry,url=127.0.0.1:{port}",
                        "--trace-config", "opentelemetry,bsp_schedule_delay=20")
    try:
        body = {"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": X.ravel().tolist()}]}
        for _ in range(20):
            r = httpx.post(f"http://{srv.http_url}/v2/models/affine/infer", json=body, timeout=30)
            assert r.status_code == 200, r.text
        deadline = time.monotonic() + 60
        while "OpenTelemetry export of" not in srv.log_text:
            assert time.monotonic() < deadline, srv.log_text
            time.sleep(0.05)
    finally:
        assert srv.stop() == 0, srv.log_text


def test_a_clients_trace_context_is_propagated_and_traced_whatever_the_rate(tmp_path, collector):
    """Triton's context propagation: a request with a W3C traceparent (HTTP header, gRPC metadata) is traced even
    at rate 0, its spans in the client's trace under the client's span; one without is not traced at rate 0."""
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG})
    srv = ServerProcess(repo, "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
                        "--trace-config", "rate=0", "--trace-config",
                        f"opentelemetry,url=127.0.0.1:{collector.port}/v1/traces", "--trace-config",
                        "opentelemetry,bsp_schedule_delay=50")
    trace_http, span_http = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    trace_grpc, span_grpc = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    body = {"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": X.ravel().tolist()}]}
    try:
        url = f"http://{srv.http_url}/v2/models/affine/infer"
        assert httpx.post(url, json=body, timeout=30).status_code == 200  # no context: not traced at rate 0
        assert httpx.post(url, json=body, timeout=30, headers={"traceparent": "00-zz-11-01"}).status_code == 200
        r = httpx.post(url, json=body, timeout=30, headers={"traceparent": f"00-{trace_http}-{span_http}-01"})
        assert r.status_code == 200
        inp = grpcclient.InferInput("in0", [1, 4], "FP32")
        inp.set_data_from_numpy(X)
        grpcclient.InferenceServerClient(srv.grpc_url).infer(
            "affine", [inp], headers={"traceparent": f"00-{trace_grpc}-{span_grpc}-01"})
        collector.wait_for(6)
    finally:
        assert srv.stop() == 0, srv.log_text
    spans = [span for _, span in collector.spans()]
    assert len(spans) == 6  # the two requests without a valid context were not traced
    assert {s["traceId"] for s in spans} == {trace_http, trace_grpc}
    roots = {s["traceId"]: s for s in spans if s["name"] == "InferRequest"}
    assert roots[trace_http]["parentSpanId"] == span_http and roots[trace_grpc]["parentSpanId"] == span_grpc


@pytest.mark.parametrize("value,valid", [
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", True),
    ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-00", True),  # case is not significant
    ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future", True),  # a later version may add fields
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", False),  # version 00 has four fields
    ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", False),
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", False),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", False),
    ("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", False),
    ("", False), ("00-" + "a" * 5000, False),
])
def test_traceparent_parsing_follows_w3c_trace_context(value, valid):
    assert (parse_traceparent(value) is not None) == valid
