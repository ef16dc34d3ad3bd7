"""The serving fast paths: runs of cheap models on the event loop thread (scheduling/inline.py's InlinePolicy), the
REST infer route answered in front of FastAPI (protocol/rest/infer.py). Results, statistics and metrics must be what
the pooled, FastAPI path gives, also with 16 clients at once over both protocols."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import numpy as np
import pytest
from serverproc import AFFINE_CONFIG, FIXTURES, ServerProcess, affine_reference, make_repository

import engine
from server.backend import RunTimings
from server.errors import ClientDisconnectedError, InvalidArgumentError
from server.inference import InferResponse, OutputTensor
from server.protocol.grpc import pb2, pb2_grpc
from server.protocol.rest.infer import InferFastPath, unless_disconnected, unless_lost
from server.protocol.rest.transport import DisconnectWatch, HeadHoldingTransport
from server.scheduling import Scheduler, SchedulerConfig
from server.scheduling.execution import run_batch
from server.scheduling.inline import InlinePolicy

# ---- InlinePolicy ------------------------------------------------------------------------------------------------


def test_inline_policy_learns_sizes_from_measured_runs():
    p = InlinePolicy(limit_ns=1000)
    assert not p.allows(0)  # nothing measured yet: everything goes to the pool first
    p.observe(64, 500)
    assert p.allows(64) and p.allows(16) and not p.allows(65)
    p.observe(4096, 5000)  # a bigger input measured slow leaves the cheap sizes alone
    assert p.allows(64) and not p.allows(4096)
    p.observe(64, 2000)  # one slow run of a cheap size: the machine's noise
    assert p.allows(64)
    p.observe(64, 2000)  # two in a row: the size goes back to the pool
    assert not p.allows(64) and p.allows(63)
    p.observe(64, 400)
    assert p.allows(64)


# ---- the direct policy ---------------------------------------------------------------------------------------------


class Doubler:
    """An engine instance stand-in: out0 = 2 * in0, sleeping `delay` s, recording the thread of each run."""

    def __init__(self, delay: float = 0.0):
        self.delay, self.threads = delay, []

    def run_timed(self, inputs):
        self.threads.append(threading.get_ident())
        if self.delay:
            time.sleep(self.delay)
        return {"out0": inputs["in0"] * 2}, RunTimings(0, 0, 0)


class Hooks:
    def __init__(self):
        self.batches, self.depths = [], []

    def on_execution(self, execution):
        self.batches.append((execution.batch_size, execution.requests))

    def on_queue_depth(self, depth):
        self.depths.append(depth)

    def on_request_done(self, outcome, queue_ns):
        pass


def direct(instances: list, hooks: Hooks | None = None, batching: bool = True, **kw) -> Scheduler:
    """The scheduler of a model without a dynamic_batching block."""
    return Scheduler(SchedulerConfig(dynamic_batching=False, max_batch_size=8 if batching else 0), instances,
                     metrics=hooks, **kw)


def _run_all(runner: Scheduler, xs: list[np.ndarray], concurrent: bool) -> list:
    async def main():
        await runner.start()
        try:
            if concurrent:
                return await asyncio.gather(*(runner.submit({"in0": x}) for x in xs))
            return [await runner.submit({"in0": x}) for x in xs]
        finally:
            await runner.stop()

    return asyncio.run(main())


def test_cheap_runs_go_inline_after_one_pooled_run_and_keep_their_statistics():
    inst, hooks = Doubler(), Hooks()
    # a generous limit: on a loaded machine a microsecond run is sometimes descheduled for far longer than 200 us
    runner = direct([inst], hooks, inline_max_ns=50_000_000)
    xs = [np.full((1, 4), i, np.float32) for i in range(20)]
    results = _run_all(runner, xs, concurrent=False)
    for x, r in zip(xs, results, strict=True):
        np.testing.assert_array_equal(r.outputs["out0"], x * 2)
        assert r.execution.batch_size == 1 and r.execution.compute_infer_ns > 0
    assert runner.inline_runs == 19  # the first run was measured in the pool
    assert inst.threads[0] != threading.get_ident() and set(inst.threads[1:]) == {threading.get_ident()}
    assert hooks.batches == [(1, 1)] * 20  # every execution reported, inline or not
    assert hooks.depths == []  # an instance was always free: nothing waited


def test_slow_runs_never_block_the_event_loop():
    inst = Doubler(delay=0.005)  # 5 ms: far over the default limit
    runner = direct([inst], batching=False)
    _run_all(runner, [np.ones((1, 4), np.float32)] * 5, concurrent=False)
    assert runner.inline_runs == 0 and threading.get_ident() not in inst.threads


def test_requests_waiting_for_an_instance_are_counted_and_all_answered():
    inst, hooks = Doubler(delay=0.002), Hooks()
    runner = direct([inst], hooks)
    xs = [np.full((1, 4), i, np.float32) for i in range(8)]
    results = _run_all(runner, xs, concurrent=True)
    for x, r in zip(xs, results, strict=True):
        np.testing.assert_array_equal(r.outputs["out0"], x * 2)
    assert max(hooks.depths) >= 1 and hooks.depths[-1] == 0
    assert sum(r.queue_ns > 0 for r in results) >= 1


def test_one_request_is_run_as_it_is_and_reports_the_engines_phases():
    inst = engine.load(FIXTURES / "affine" / "1" / "model.pnnx.param").instance(max_shapes={"in0": (8, 4)})
    x1, x2 = np.ones((2, 4), np.float32), np.full((2, 4), -3, np.float32)
    (out1,), run = run_batch(inst, [{"in0": x1}], [2])
    kept = {k: v.copy() for k, v in out1.items()}
    run_batch(inst, [{"in0": x2}], [2])  # the arena now holds x2's activations: out1 must not change (caller-owned)
    for name, ref in affine_reference(x1).items():
        np.testing.assert_allclose(out1[name], ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(out1[name], kept[name])
    assert run.compute_input_ns > 0 and run.compute_infer_ns > 0 and run.compute_output_ns > 0
    assert run.batch_size == 2 and run.requests == 1


# ---- the REST fast path in process ------------------------------------------------------------------------------


class FakeDataPlane:
    """infer: echoes in0 as out0, or raises what `error` holds."""

    def __init__(self, error: Exception | None = None):
        self.error = error

    async def infer(self, req):
        if self.error is not None:
            raise self.error
        x = req.inputs[0].data
        return InferResponse(req.model_name, "1", req.id, [OutputTensor("out0", "FP32", list(x.shape), x)])


async def _call(app, body: bytes, path: str = "/v2/models/m/infer") -> tuple[dict, bytes]:
    """(response start, body) of one POST through `app`; empty when it answered nothing."""
    sent, messages = [], [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # the client stays connected

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [(b"content-type", b"application/json")]}
    await app(scope, receive, send)
    return (sent[0], sent[1]["body"]) if sent else ({}, b"")


BODY = b'{"id":"7","inputs":[{"name":"in0","shape":[1,2],"datatype":"FP32","data":[1.5,-2]}]}'


def test_fast_path_answers_infer_and_passes_everything_else_on():
    passed = []

    async def fallback(scope, receive, send):
        passed.append(scope["path"])

    app = InferFastPath(fallback, FakeDataPlane(), 1 << 20)
    start, body = asyncio.run(_call(app, BODY, "/v2/models/m/versions/3/infer"))
    assert start["status"] == 200 and (b"content-type", b"application/json") in start["headers"]
    assert body == b'{"model_name":"m","model_version":"1","outputs":[{"name":"out0","datatype":"FP32",' \
                   b'"shape":[1,2],"data":[1.5,-2.0]}],"id":"7"}'
    asyncio.run(_call(app, BODY, "/v2/models/m/infer/extra"))
    asyncio.run(_call(app, BODY, "/v2/models/m/versions/3/4/infer"))
    assert passed == ["/v2/models/m/infer/extra", "/v2/models/m/versions/3/4/infer"]


def test_the_fastapi_route_behind_the_fast_path_answers_the_same():
    from fastapi.testclient import TestClient

    from server.protocol.rest import create_app

    served = create_app(FakeDataPlane())
    assert isinstance(served, InferFastPath)
    fast_start, fast_body = asyncio.run(_call(served, BODY))
    r = TestClient(served.app).post("/v2/models/m/infer", content=BODY)  # the FastAPI app itself
    assert r.status_code == fast_start["status"] == 200 and r.content == fast_body
    assert r.headers["content-type"] == "application/json"
    bad = TestClient(create_app(FakeDataPlane(InvalidArgumentError("bad input"))).app)
    assert bad.post("/v2/models/m/infer", content=BODY).json() == {"error": "bad input"}


@pytest.mark.parametrize(("error", "status", "message"), [
    (InvalidArgumentError("bad input"), 400, '{"error":"bad input"}'),
    (RuntimeError("boom"), 500, '{"error":"internal error: RuntimeError: boom"}'),
])
def test_fast_path_maps_errors_as_the_fastapi_app_does(error, status, message):
    start, body = asyncio.run(_call(InferFastPath(None, FakeDataPlane(error), 1 << 20), BODY))
    assert start["status"] == status and body.decode() == message


async def _wait_to_be_cancelled(cancelled: asyncio.Event) -> None:
    """Work that only ends by being cancelled, and says so through `cancelled`."""
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        cancelled.set()
        raise


def test_a_client_hanging_up_cancels_the_work():
    cancelled = asyncio.Event()

    async def receive():
        await asyncio.sleep(0.01)
        return {"type": "http.disconnect"}

    async def main():
        with pytest.raises(ClientDisconnectedError):
            await unless_disconnected(receive, _wait_to_be_cancelled(cancelled))
        assert cancelled.is_set()
        return await unless_disconnected(receive, asyncio.sleep(0, result=5))  # finished first: no disconnect

    assert asyncio.run(main()) == 5


def test_a_lost_connection_cancels_the_work_through_its_watch():
    """The server's own protocol cancels the registered task when the connection is lost (no watcher task)."""
    cancelled = asyncio.Event()

    async def main():
        watch = DisconnectWatch()
        asyncio.get_running_loop().call_later(0.01, watch.connection_lost)
        with pytest.raises(ClientDisconnectedError):
            await unless_lost(watch, _wait_to_be_cancelled(cancelled))
        assert cancelled.is_set() and not watch.tasks
        cancelled.clear()
        with pytest.raises(ClientDisconnectedError):  # lost before: cancelled where the work first waits
            await unless_lost(watch, _wait_to_be_cancelled(cancelled))
        assert cancelled.is_set()
        fresh = DisconnectWatch()
        result = await unless_lost(fresh, asyncio.sleep(0, result=5))  # finished first: no disconnect
        fresh.connection_lost()  # after the answer: cancels nothing
        return result

    assert asyncio.run(main()) == 5


# ---- one send per response ---------------------------------------------------------------------------------------


class RecordingTransport:
    def __init__(self):
        self.sends, self.closed = [], False

    def write(self, data):
        self.sends.append(data)

    def writelines(self, parts):
        self.sends.append(b"".join(parts))

    def close(self):
        self.closed = True

    def is_closing(self):
        return self.closed


def test_head_and_body_go_out_in_one_send_and_a_lone_head_on_the_next_loop_turn():
    async def main():
        real = RecordingTransport()
        t = HeadHoldingTransport(real, asyncio.get_running_loop())
        t.write(b"HEAD1")
        t.write(b"BODY1")
        assert real.sends == [b"HEAD1BODY1"]
        t.write(b"HEAD2")  # e.g. 100-continue, or a head whose body the app has not sent yet
        assert real.sends == [b"HEAD1BODY1"] and not t.is_closing()  # delegated
        await asyncio.sleep(0)
        assert real.sends == [b"HEAD1BODY1", b"HEAD2"]
        t.write(b"HEAD3")
        t.close()  # nothing held back from a closing connection
        assert real.sends[-1] == b"HEAD3" and real.closed

    asyncio.run(main())


# ---- 16 clients at once against a real server -------------------------------------------------------------------

DIRECT_CONFIG = AFFINE_CONFIG.replace("dynamic_batching { max_queue_delay_microseconds: 20000 }\n", "")
CLIENTS, PER_CLIENT = 16, 12


@pytest.fixture(scope="module")
def direct_server(tmp_path_factory):
    assert "dynamic_batching" not in DIRECT_CONFIG
    srv = ServerProcess(make_repository(tmp_path_factory.mktemp("fast"), {"affine": DIRECT_CONFIG}))
    yield srv
    assert srv.stop() == 0, srv.log_text


def _counter(text: str, name: str) -> float:
    m = re.search(rf'^{name}\{{model="affine",version="1"\}} ([\d.e+]+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def _http_client(url: str, seed: int) -> int:
    rng = np.random.default_rng(seed)
    with httpx.Client(base_url=f"http://{url}") as client:
        for i in range(PER_CLIENT):
            x = rng.standard_normal((1 + i % 3, 4)).astype(np.float32)
            body = {"id": f"{seed}-{i}", "inputs": [{"name": "in0", "shape": list(x.shape), "datatype": "FP32",
                                                     "data": x.ravel().tolist()}]}
            r = client.post("/v2/models/affine/infer", json=body)
            assert r.status_code == 200, r.text
            doc, ref = r.json(), affine_reference(x)
            assert doc["id"] == f"{seed}-{i}"
            for out in doc["outputs"]:
                got = np.array(out["data"], np.float32).reshape(out["shape"])
                np.testing.assert_allclose(got, ref[out["name"]], rtol=1e-5, atol=1e-6)
    return PER_CLIENT


def _grpc_client(url: str, seed: int) -> int:
    rng = np.random.default_rng(seed)
    with grpc.insecure_channel(url) as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        for i in range(PER_CLIENT):
            x = rng.standard_normal((1 + i % 3, 4)).astype(np.float32)
            req = pb2.ModelInferRequest(model_name="affine", id=f"{seed}-{i}", raw_input_contents=[x.tobytes()])
            req.inputs.add(name="in0", datatype="FP32", shape=list(x.shape))
            resp = stub.ModelInfer(req, timeout=30)
            assert resp.id == f"{seed}-{i}"
            ref = affine_reference(x)
            for out, raw in zip(resp.outputs, resp.raw_output_contents, strict=True):
                got = np.frombuffer(raw, np.float32).reshape(list(out.shape))
                np.testing.assert_allclose(got, ref[out.name], rtol=1e-5, atol=1e-6)
    return PER_CLIENT


def test_sixteen_clients_over_both_protocols_get_their_own_answers_and_exact_counts(direct_server):
    url = f"http://{direct_server.http_url}/v2/models/affine/stats"
    before = httpx.get(url).json()["model_stats"][0]
    metrics_before = httpx.get(direct_server.metrics_url).text
    with ThreadPoolExecutor(CLIENTS) as pool:
        jobs = [pool.submit(_http_client if k % 2 else _grpc_client,
                            direct_server.http_url if k % 2 else direct_server.grpc_url, k) for k in range(CLIENTS)]
        sent = sum(job.result() for job in jobs)
    after = httpx.get(url).json()["model_stats"][0]
    metrics_after = httpx.get(direct_server.metrics_url).text
    rows = sum(1 + i % 3 for i in range(PER_CLIENT)) * CLIENTS  # inference_count counts batch rows
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == sent
    assert after["execution_count"] - before["execution_count"] == sent  # no dynamic batching: one run each
    assert after["inference_count"] - before["inference_count"] == rows
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]
    for name, delta in (("nv_inference_request_success", sent), ("nv_inference_exec_count", sent),
                        ("nv_inference_count", rows)):
        assert _counter(metrics_after, name) - _counter(metrics_before, name) == delta, name


# ---- histograms ----------------------------------------------------------------------------------------------------


def test_histograms_expose_what_prometheus_clients_histogram_would():
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from server.metrics import BATCH_BUCKETS, LATENCY_BUCKETS, ServerMetrics

    m = ServerMetrics()
    registry = CollectorRegistry()
    ref_request = Histogram("nnserve_request_duration_seconds", "End-to-end request latency", ["model", "version"],
                            buckets=LATENCY_BUCKETS, registry=registry)
    ref_batch = Histogram("nnserve_batch_size", "Batch size of each model execution", ["model", "version"],
                          buckets=BATCH_BUCKETS, registry=registry)
    for total_ns, batch in [(3000, 2), (100_000, 1), (2_000_000, 8), (20_000_000_000, 1), (250_000, 128)]:
        m.request_ok("m", "1", total_ns=total_ns, queue_ns=0, input_ns=0, infer_ns=0, output_ns=0, batch=batch)
        m.execution("m", "1", batch)
        ref_request.labels("m", "1").observe(total_ns / 1e9)  # bucket bounds are inclusive: 1e-4 lands in le=1e-4
        ref_batch.labels("m", "1").observe(batch)

    def lines(text: bytes) -> set[str]:
        return {ln for ln in text.decode().splitlines()
                if ln.startswith(("nnserve_request_duration_seconds", "nnserve_batch_size")) and "_created" not in ln}

    ours = lines(m.render())
    assert ours == lines(generate_latest(registry))
    assert 'nnserve_request_duration_seconds_bucket{le="0.0001",model="m",version="1"} 2.0' in ours


def _patch_release(monkeypatch, release, loop_idle_s: float) -> None:
    """The schedulers' release of kernel threads replaced by `release`; the loop's quiet spell `loop_idle_s`, the
    workers' an hour (they let go at stop only)."""
    from server.scheduling import scheduler as scheduler_module
    from server.scheduling import workers as workers_module

    monkeypatch.setattr(scheduler_module, "release_kernel_threads", release)
    monkeypatch.setattr(scheduler_module, "IDLE_RELEASE_S", loop_idle_s)
    monkeypatch.setattr(workers_module, "IDLE_RELEASE_S", 3600.0)


def _serve_until(runner: Scheduler, requests: int, done) -> None:
    """`requests` requests one after another, then the loop idles until done() (waited for, never slept for: at
    most 60 s on a loaded machine) and a little more, then the scheduler stops."""

    async def main():
        await runner.start()
        try:
            for i in range(requests):
                await runner.submit({"in0": np.full((1, 4), i, np.float32)})
            for _ in range(6000):
                if done():
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
        finally:
            await runner.stop()

    asyncio.run(main())


def test_the_event_loop_thread_lets_its_kernel_threads_go_once_inline_runs_stop(monkeypatch):
    """An inline run may give the loop thread an OpenMP team (scheduling/workers.py): it goes after
    IDLE_RELEASE_S without inline runs, on the loop thread, once per quiet spell; and at stop when still pending."""
    released = []
    _patch_release(monkeypatch, lambda: released.append(threading.get_ident()) or True, 0.01)
    inst = Doubler()
    runner = direct([inst], inline_max_ns=50_000_000)

    _serve_until(runner, 5, lambda: bool(released))
    assert runner.inline_runs == 4
    loop_thread, worker = threading.get_ident(), inst.threads[0]  # the first run went to a worker
    assert released.count(loop_thread) >= 1  # on the loop thread (this one); once per quiet spell of 10 ms
    assert released.count(worker) == 1 and set(released) == {loop_thread, worker}  # the worker: at stop


def test_a_scheduler_stopped_before_the_quiet_spell_lets_the_loop_threads_go_at_stop(monkeypatch):
    released = []
    _patch_release(monkeypatch, lambda: released.append(threading.get_ident()) or True, 3600.0)
    inst = Doubler()
    runner = direct([inst], inline_max_ns=50_000_000)
    _run_all(runner, [np.ones((1, 4), np.float32)] * 3, concurrent=False)
    assert runner.inline_runs == 2
    assert sorted(released) == sorted([threading.get_ident(), inst.threads[0]])  # the loop's and the worker's


def test_a_loop_release_refused_for_now_is_tried_again(monkeypatch):
    answers = iter([False, False, True])
    released = []

    def release():
        released.append(threading.get_ident())
        return next(answers, True)

    _patch_release(monkeypatch, release, 0.01)
    inst = Doubler()
    runner = direct([inst], inline_max_ns=50_000_000)

    _serve_until(runner, 3, lambda: released.count(threading.get_ident()) >= 3)
    assert released.count(threading.get_ident()) >= 3  # refused twice, then let go
