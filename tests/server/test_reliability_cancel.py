"""A client that goes away while its request executes (an HTTP client disconnecting, a gRPC deadline expiring) never
makes another request fail: the instance running the abandoned request goes back to the pool only when that run has
finished, so no other request is ever handed an instance that is still running ("already running on another
thread").

The test-only plugin tests/server/held_ops.py holds the executions of chosen requests at a gate: both instances of
each model are kept busy with requests whose clients then go away, and the requests that arrive next must all wait in
the queue (the pending-request gauge counts them) instead of failing; when the gate opens every one of them is
answered correctly. A second phase mixes many clients, some cancelling at random points, and counts no failure among
the others."""

from __future__ import annotations

import json
import random
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from serverproc import AFFINE_CONFIG, ServerProcess, affine_reference, make_repository

from server.protocol.grpc import pb2, pb2_grpc

pytestmark = pytest.mark.slow  # starts its own server

DIRECT = AFFINE_CONFIG.replace("dynamic_batching { max_queue_delay_microseconds: 20000 }", "")
BATCHED = AFFINE_CONFIG.replace("max_queue_delay_microseconds: 20000", "max_queue_delay_microseconds: 2000")
# Rows that drive the affine model's Sigmoid input past held_ops' bounds (that module is the server's plugin only:
# importing it here would replace the Sigmoid op of the test process).
HOLD_ROW, SLOW_ROW = [1e26] * 4, [1e13] * 4
MODELS = ("direct", "batched")
WAITING = 8  # requests per model that arrive while both its instances run abandoned requests


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gate")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gate: Path):
    repo = make_repository(tmp_path_factory.mktemp("cancelrepo"), {"direct": DIRECT, "batched": BATCHED,
                                                                     "direct_mix": DIRECT, "batched_mix": BATCHED})
    env = {"NNSERVE_PLUGINS": "held_ops", "NNSERVE_TEST_GATE": str(gate),
           "PYTHONPATH": str(Path(__file__).resolve().parent)}
    srv = ServerProcess(repo, env=env)
    yield srv
    (gate / "open").touch()  # never leave an execution held
    assert srv.stop() == 0, srv.log_text


def body(row: list[float]) -> bytes:
    return json.dumps({"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": row}]}).encode()


def grpc_request(model: str, row: list[float]) -> pb2.ModelInferRequest:
    req = pb2.ModelInferRequest(model_name=model)
    req.inputs.add(name="in0", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(np.array(row, np.float32).tobytes())
    return req


def good_row(i: int) -> list[float]:
    return [0.1 * i, -0.2, 0.3, 1.0 + i]


def check_outputs(outputs: dict[str, np.ndarray], row: list[float]) -> None:
    with np.errstate(over="ignore"):  # the sigmoid of a SLOW row: exp overflows to inf, which gives 0 as it should
        reference = affine_reference(np.array([row], np.float32))
    for name, expected in reference.items():
        np.testing.assert_allclose(outputs[name].reshape(expected.shape), expected, rtol=1e-5, atol=1e-6)


def infer_http(srv: ServerProcess, model: str, row: list[float], timeout: float = 120) -> dict[str, np.ndarray]:
    r = httpx.post(f"http://{srv.http_url}/v2/models/{model}/infer", content=body(row), timeout=timeout,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    return {o["name"]: np.array(o["data"]) for o in r.json()["outputs"]}


def infer_grpc(stub: pb2_grpc.GRPCInferenceServiceStub, model: str, row: list[float],
               timeout: float = 120) -> dict[str, np.ndarray]:
    resp = stub.ModelInfer(grpc_request(model, row), timeout=timeout)
    return {o.name: np.frombuffer(raw, np.float32) for o, raw in zip(resp.outputs, resp.raw_output_contents,
                                                                    strict=True)}


def metric(srv: ServerProcess, line_start: str) -> float:
    for line in httpx.get(srv.metrics_url, timeout=30).text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def pending(srv: ServerProcess, model: str) -> float:
    return metric(srv, f'nv_inference_pending_request_count{{model="{model}",version="1"}}')


def wait_until(predicate, what: str, srv: ServerProcess, timeout: float = 120) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert srv.proc.poll() is None, f"the server exited while waiting for {what}:\n{srv.log_text}"
        assert time.monotonic() < deadline, f"never saw {what}:\n{srv.log_text}"
        time.sleep(0.05)


def entered(gate: Path) -> int:
    return len(list(gate.glob("entered-*")))


def send_and_hang_up_later(srv: ServerProcess, model: str) -> socket.socket:
    """An HTTP request written on a raw socket, whose client will hang up (close) without reading the answer."""
    sock = socket.create_connection(("127.0.0.1", srv.ports["http"]), timeout=30)
    payload = body(HOLD_ROW)
    sock.sendall(f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


def test_abandoned_executions_keep_their_instances(server: ServerProcess, gate: Path) -> None:
    held_sockets, abandoned = [], []
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        executing = 0
        for model in MODELS:  # one at a time, so each runs alone on an instance: both instances end up busy
            held_sockets.append(send_and_hang_up_later(server, model))
            executing += 1
            wait_until(lambda n=executing: entered(gate) >= n, "the HTTP request executing", server)
            # "direct": the deadline expires while it executes; "batched": the client cancels the call
            call = stub.ModelInfer.future(grpc_request(model, HOLD_ROW), timeout=10.0 if model == "direct" else None)
            abandoned.append(call)
            executing += 1
            wait_until(lambda n=executing: entered(gate) >= n, "the gRPC request executing", server)
        for sock in held_sockets:
            sock.close()  # the HTTP clients hang up while their requests execute
        abandoned[1].cancel()
        with pytest.raises(grpc.RpcError) as info:
            abandoned[0].result(timeout=60)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert abandoned[1].cancelled()
        wait_until(lambda: metric(server, 'nv_inference_request_failure{model="direct",reason="CANCELED",'
                                          'version="1"}') >= 1, "the server cancelling the expired call", server)
        assert entered(gate) == 2 * len(MODELS)  # every instance of both models still runs an abandoned request

        # Requests arriving now find no free instance: they wait, none is handed a busy one.
        with ThreadPoolExecutor(2 * len(MODELS) * WAITING) as pool:
            jobs = []
            for model in MODELS:
                for i in range(WAITING):
                    row = good_row(i)
                    if i % 2:
                        jobs.append((pool.submit(infer_grpc, stub, model, row), row))
                    else:
                        jobs.append((pool.submit(infer_http, server, model, row), row))
            for model in MODELS:  # (a request handed a busy instance would fail at once: stop waiting then)
                wait_until(lambda m=model: pending(server, m) == WAITING or any(job.done() for job, _ in jobs),
                           f"{WAITING} requests queued for {model}", server)
            assert not any(job.done() for job, _ in jobs), [job.exception() for job, _ in jobs if job.done()]
            (gate / "open").touch()
            for job, row in jobs:
                check_outputs(job.result(timeout=120), row)
    assert server.proc.poll() is None
    assert "already running on another thread" not in server.log_text


def test_many_clients_some_cancelling(server: ServerProcess, gate: Path) -> None:
    """Clients cancelling at random points (queued, executing, answered) among clients that do not: every request
    of the latter is answered, correctly."""
    (gate / "open").touch()  # rows beyond HOLD pass; SLOW rows keep executions long enough to be cancelled in
    rng = random.Random(0)
    plans = []
    for i in range(240):  # (model, cancels, protocol, i, timeout): a canceller gives up after 1 to 50 ms
        cancels = rng.random() < 0.4
        plans.append((rng.choice(("direct_mix", "batched_mix")), cancels, rng.choice(("http", "grpc")), i,
                      0.001 + 0.05 * rng.random() if cancels else 120.0))
    failures: list[str] = []
    answered = []

    def client(model: str, cancels: bool, protocol: str, i: int, timeout: float,
               stub: pb2_grpc.GRPCInferenceServiceStub) -> None:
        row = SLOW_ROW if cancels or i % 3 == 0 else good_row(i)
        try:
            outputs = infer_grpc(stub, model, row, timeout) if protocol == "grpc" else \
                infer_http(server, model, row, timeout)
        except (grpc.RpcError, httpx.TimeoutException, AssertionError) as exc:
            if not cancels:
                failures.append(f"{protocol} {model} {i}: {exc!r}")
            return
        if not cancels:
            check_outputs(outputs, row)
            answered.append(i)

    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        with ThreadPoolExecutor(24) as pool:
            for job in [pool.submit(client, *plan, stub) for plan in plans]:
                job.result(timeout=300)
    assert failures == []
    assert len(answered) == sum(1 for plan in plans if not plan[1])
    assert server.proc.poll() is None
    assert "already running on another thread" not in server.log_text
    for model in ("direct_mix", "batched_mix"):  # and the models still serve
        check_outputs(infer_http(server, model, good_row(1)), good_row(1))
