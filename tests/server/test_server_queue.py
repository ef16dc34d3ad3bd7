"""Queue policy errors end to end: Triton's messages and status codes on both protocols, and dropped clients."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import numpy as np
import pytest
from serverproc import AFFINE_CONFIG, ServerProcess, make_repository

from server.protocol.grpc import pb2, pb2_grpc

pytestmark = pytest.mark.slow  # its own server

BODY = {"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]}

# One instance, batches wait up to 0.8 s, at most 2 requests queued.
TIGHT = AFFINE_CONFIG.replace("max_queue_delay_microseconds: 20000",
                              "max_queue_delay_microseconds: 800000 default_queue_policy { max_queue_size: 2 }"
                              ).replace("count: 2", "count: 1")
# Requests may wait 50 ms but the batcher would hold them for 3 s: they expire.
TIMED = AFFINE_CONFIG.replace("max_queue_delay_microseconds: 20000",
                              "max_queue_delay_microseconds: 3000000 default_queue_policy { "
                              "default_timeout_microseconds: 50000 allow_timeout_override: true }")

# The batcher would hold a partial batch for 3 s, but the adaptive wait sends a lone client's request at once.
ADAPTIVE = AFFINE_CONFIG.replace("max_queue_delay_microseconds: 20000", "max_queue_delay_microseconds: 3000000"
                                 ) + 'parameters { key: "dynamic_batching_wait" value { string_value: "adaptive" } }\n'


@pytest.fixture(scope="module")
def qserver(tmp_path_factory):
    repo = make_repository(tmp_path_factory.mktemp("qrepo"), {"tight": TIGHT, "timed": TIMED, "adaptive": ADAPTIVE})
    srv = ServerProcess(repo)
    yield srv
    assert srv.stop() == 0, srv.log_text


def post(srv: ServerProcess, model: str, body: dict = BODY) -> httpx.Response:
    return httpx.post(f"http://{srv.http_url}/v2/models/{model}/infer", json=body, timeout=30)


def test_queue_full_is_503(qserver):
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: post(qserver, "tight"), range(8)))
    rejected = [r for r in codes if r.status_code == 503]
    assert rejected and all(r.json()["error"] == "Exceeds maximum queue size" for r in rejected)
    assert any(r.status_code == 200 for r in codes)


def test_queue_full_is_unavailable_over_grpc(qserver):
    async def main() -> list[grpc.StatusCode]:
        async with grpc.aio.insecure_channel(qserver.grpc_url) as channel:
            stub = pb2_grpc.GRPCInferenceServiceStub(channel)

            async def one() -> grpc.StatusCode:
                req = pb2.ModelInferRequest(model_name="tight")
                req.inputs.add(name="in0", datatype="FP32", shape=[1, 4])
                req.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
                try:
                    await stub.ModelInfer(req)
                    return grpc.StatusCode.OK
                except grpc.aio.AioRpcError as err:
                    assert err.details() == "Exceeds maximum queue size"
                    return err.code()

            return await asyncio.gather(*(one() for _ in range(8)))

    codes = asyncio.run(main())
    assert grpc.StatusCode.UNAVAILABLE in codes and grpc.StatusCode.OK in codes


def test_queue_timeout_expires(qserver):
    t0 = time.monotonic()
    r = post(qserver, "timed")
    assert r.status_code == 503 and r.json()["error"] == "Request timeout expired"
    assert time.monotonic() - t0 < 2.0  # rejected at its deadline, not when the batch would have gone (3 s)
    # a request may lower its own timeout (schedule_policy extension) but not raise it
    r = post(qserver, "timed", {**BODY, "parameters": {"timeout": 10_000_000}})
    assert r.status_code == 503
    text = httpx.get(qserver.metrics_url).text
    assert 'nv_inference_request_failure{model="timed",reason="REJECTED",version="1"} 2.0' in text


def test_grpc_deadline_drops_the_queued_request(qserver):
    """A client whose deadline passes is dropped from the queue (counted as CANCELED), not computed."""
    with grpc.insecure_channel(qserver.grpc_url) as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        req = pb2.ModelInferRequest(model_name="tight")
        req.inputs.add(name="in0", datatype="FP32", shape=[1, 4])
        req.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
        before = stub.ModelStatistics(pb2.ModelStatisticsRequest(name="tight")).model_stats[0]
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(req, timeout=0.1)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        time.sleep(1.2)  # past the batcher's 0.8 s delay: a still-queued request would have run by now
        after = stub.ModelStatistics(pb2.ModelStatisticsRequest(name="tight")).model_stats[0]
    assert after.execution_count == before.execution_count
    assert after.inference_stats.fail.count == before.inference_stats.fail.count + 1
    assert 'reason="CANCELED",version="1"} 1.0' in httpx.get(qserver.metrics_url).text


def test_http_disconnect_drops_the_queued_request(qserver):
    before = httpx.get(f"http://{qserver.http_url}/v2/models/tight/stats").json()["model_stats"][0]
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"http://{qserver.http_url}/v2/models/tight/infer", json=BODY, timeout=0.1)
    time.sleep(1.2)
    after = httpx.get(f"http://{qserver.http_url}/v2/models/tight/stats").json()["model_stats"][0]
    assert after["execution_count"] == before["execution_count"]
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"] + 1


def test_adaptive_wait_answers_a_lone_client_without_the_delay(qserver):
    config = httpx.get(f"http://{qserver.http_url}/v2/models/adaptive/config").json()
    assert config["parameters"]["dynamic_batching_wait"]["string_value"] == "adaptive"
    for _ in range(3):
        started = time.monotonic()
        r = post(qserver, "adaptive")
        assert r.status_code == 200, r.text
        assert time.monotonic() - started < 1.5  # not the configured 3 s
