"""SIGTERM with 32 requests in flight over both protocols: readiness 503 at once, new requests still served during
--drain-delay-secs, then the listeners close, every in-flight request completes with the correct answer within
--exit-timeout-secs, and the process exits 0."""

from __future__ import annotations

import signal
import threading
import time

import grpc
import httpx
import numpy as np
import pytest
from serverproc import AFFINE_CONFIG, ServerProcess, affine_reference, make_repository

from server.protocol.grpc import pb2, pb2_grpc

pytestmark = pytest.mark.slow  # starts its own server

IN_FLIGHT = 32
DRAIN = 2.0
# The batcher holds requests 8 s waiting for a batch of 64: the 32 requests are all queued when SIGTERM comes.
SLOW = AFFINE_CONFIG.replace("max_batch_size: 8", "max_batch_size: 64").replace(
    "max_queue_delay_microseconds: 20000", "max_queue_delay_microseconds: 8000000")


def row(i: int) -> np.ndarray:
    return np.array([[i, -i / 2, 1.0, i / 10]], np.float32)


def send_http(srv: ServerProcess, i: int, results: dict) -> None:
    body = {"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": row(i).reshape(-1).tolist()}]}
    try:
        r = httpx.post(f"http://{srv.http_url}/v2/models/affine/infer", json=body, timeout=60)
        results[i] = (r.status_code, {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in
                                      r.json().get("outputs", [])})
    except Exception as exc:  # recorded and asserted on below
        results[i] = (repr(exc), {})


def send_grpc(srv: ServerProcess, i: int, results: dict) -> None:
    req = pb2.ModelInferRequest(model_name="affine")
    req.inputs.add(name="in0", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(row(i).tobytes())
    try:
        with grpc.insecure_channel(srv.grpc_url) as channel:
            resp = pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(req, timeout=60)
        results[i] = (200, {o.name: np.frombuffer(raw, np.float32).reshape(o.shape)
                            for o, raw in zip(resp.outputs, resp.raw_output_contents, strict=True)})
    except grpc.RpcError as exc:
        results[i] = (str(exc.code()), {})


def pending(srv: ServerProcess) -> float:
    for line in httpx.get(srv.metrics_url, timeout=10).text.splitlines():
        if line.startswith('nv_inference_pending_request_count{model="affine"'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_sigterm_drains_32_requests_in_flight(tmp_path) -> None:
    repo = make_repository(tmp_path / "repo", {"affine": SLOW})
    srv = ServerProcess(repo, "--drain-delay-secs", str(DRAIN), "--exit-timeout-secs", "20")
    results: dict[int, tuple] = {}
    threads = [threading.Thread(target=send_http if i % 2 else send_grpc, args=(srv, i, results))
               for i in range(IN_FLIGHT)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    seen = []
    while not seen or seen[-1] < IN_FLIGHT:
        seen.append(pending(srv))
        assert time.monotonic() < deadline, f"the requests never queued: {seen[-20:]}"
        time.sleep(0.02)
    assert not results, "requests finished before SIGTERM: nothing to drain"

    srv.proc.send_signal(signal.SIGTERM)
    t_term = time.monotonic()
    time.sleep(0.1)
    ready = httpx.get(f"http://{srv.http_url}/v2/health/ready", timeout=5)
    assert ready.status_code == 503  # an answer at all: the listener is still open during the drain delay
    late: dict[int, tuple] = {}  # arrives during the drain delay: still accepted and answered
    late_thread = threading.Thread(target=send_http, args=(srv, IN_FLIGHT + 1, late))
    late_thread.start()
    time.sleep(max(DRAIN - (time.monotonic() - t_term), 0) + 0.3)
    closed = time.monotonic() + 10
    while True:  # after the drain delay the listener is closed
        try:
            httpx.get(f"http://{srv.http_url}/v2/health/live", timeout=5)
        except httpx.ConnectError:
            break
        assert time.monotonic() < closed, "the listener stayed open after the drain delay"
        time.sleep(0.1)

    assert srv.proc.wait(30) == 0, srv.log_text
    for t in [*threads, late_thread]:
        t.join(30)
    assert sorted(results) == list(range(IN_FLIGHT))
    for i, (status, outs) in sorted({**results, **late}.items()):
        assert status == 200, (i, status)
        for name, expected in affine_reference(row(i)).items():
            np.testing.assert_allclose(outs[name], expected, rtol=1e-5, atol=1e-6)
    assert "Traceback" not in srv.log_text, srv.log_text


def test_exit_timeout_bounds_the_drain(tmp_path) -> None:
    """A request that would need 8 s more does not hold the process past --exit-timeout-secs: it is cancelled
    (counted as CANCELED) and the server exits 0 soon after the timeout."""
    repo = make_repository(tmp_path / "repo", {"affine": SLOW})
    srv = ServerProcess(repo, "--drain-delay-secs", "0", "--exit-timeout-secs", "1")
    results: dict[int, tuple] = {}
    t = threading.Thread(target=send_http, args=(srv, 3, results))
    t.start()
    deadline = time.monotonic() + 20
    while pending(srv) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(30) == 0, srv.log_text
    assert time.monotonic() - t0 < 5, "the exit timeout did not bound the drain:\n" + srv.log_text
    t.join(30)
    assert results[3][0] != 200  # the client saw its request fail (connection closed), not a late answer
