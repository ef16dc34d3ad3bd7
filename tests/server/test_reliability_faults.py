"""A kernel that raises (injected by the test-only plugin tests/server/faulty_ops.py through NNSERVE_PLUGINS) fails
only the requests of that execution, with an error and counted as reason BACKEND; the instance keeps serving."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from serverproc import AFFINE_CONFIG, ServerProcess, affine_reference, make_repository

from server.protocol.grpc import pb2, pb2_grpc

pytestmark = pytest.mark.slow  # starts its own server

POISONED = [1e36, 1e36, 1e36, 1e36]  # drives the Sigmoid input past faulty_ops.POISON
# one request per execution (no dynamic batching), and a batcher that holds requests 50 ms to merge them
DIRECT = AFFINE_CONFIG.replace("dynamic_batching { max_queue_delay_microseconds: 20000 }", "")
BATCHED = AFFINE_CONFIG.replace("max_queue_delay_microseconds: 20000", "max_queue_delay_microseconds: 50000")


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    repo = make_repository(tmp_path_factory.mktemp("faultrepo"), {"direct": DIRECT, "batched": BATCHED})
    env = {"NNSERVE_PLUGINS": "faulty_ops", "PYTHONPATH": str(Path(__file__).resolve().parent)}
    srv = ServerProcess(repo, env=env)
    yield srv
    assert srv.stop() == 0, srv.log_text


def infer(srv: ServerProcess, model: str, row: list[float]) -> httpx.Response:
    body = {"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": row}]}
    return httpx.post(f"http://{srv.http_url}/v2/models/{model}/infer", json=body, timeout=60)


def good_row(i: int) -> list[float]:
    return [0.1 * i, -0.2, 0.3, 1.0 + i]


def assert_correct(r: httpx.Response, row: list[float]) -> None:
    assert r.status_code == 200, r.text
    outs = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}
    for name, expected in affine_reference(np.array([row], np.float32)).items():
        np.testing.assert_allclose(outs[name], expected, rtol=1e-5, atol=1e-6)


def failures(srv: ServerProcess, model: str) -> float:
    line = f'nv_inference_request_failure{{model="{model}",reason="BACKEND",version="1"}}'
    found = [ln for ln in httpx.get(srv.metrics_url, timeout=10).text.splitlines() if ln.startswith(line)]
    return float(found[0].rsplit(" ", 1)[1]) if found else 0.0


def test_one_execution_fails_the_others_are_served(faulty: ServerProcess) -> None:
    rows = [POISONED] + [good_row(i) for i in range(10)]
    with ThreadPoolExecutor(len(rows)) as pool:
        answers = list(pool.map(lambda row: infer(faulty, "direct", row), rows))
    bad, good = answers[0], answers[1:]
    assert bad.status_code == 500 and "injected fault" in bad.json()["error"], bad.text
    assert "Sigmoid" in bad.json()["error"]  # the engine names the failing node's op
    for r, row in zip(good, rows[1:], strict=True):
        assert_correct(r, row)
    assert failures(faulty, "direct") == 1.0


def test_a_failing_batch_fails_only_its_requests(faulty: ServerProcess) -> None:
    rows = [POISONED] + [good_row(i) for i in range(5)]
    with ThreadPoolExecutor(len(rows)) as pool:
        answers = list(pool.map(lambda row: infer(faulty, "batched", row), rows))
    assert answers[0].status_code == 500 and "injected fault" in answers[0].json()["error"]
    failed = [r for r in answers if r.status_code != 200]
    # requests merged into the poisoned batch share its error; every other one is answered correctly
    assert all(r.status_code == 500 and "injected fault" in r.json()["error"] for r in failed)
    for r, row in zip(answers[1:], rows[1:], strict=True):
        if r.status_code == 200:
            assert_correct(r, row)
    assert failures(faulty, "batched") == len(failed)
    # the instances keep serving: a later burst is answered in full
    with ThreadPoolExecutor(8) as pool:
        later = list(pool.map(lambda i: infer(faulty, "batched", good_row(i)), range(8)))
    for i, r in enumerate(later):
        assert_correct(r, good_row(i))


def test_grpc_kernel_failure_is_internal(faulty: ServerProcess) -> None:
    with grpc.insecure_channel(faulty.grpc_url) as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        for row, ok in ((POISONED, False), (good_row(1), True)):
            req = pb2.ModelInferRequest(model_name="direct")
            req.inputs.add(name="in0", datatype="FP32", shape=[1, 4])
            req.raw_input_contents.append(np.array(row, np.float32).tobytes())
            if ok:
                assert len(stub.ModelInfer(req, timeout=30).raw_output_contents) == 2
                continue
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(req, timeout=30)
            assert info.value.code() == grpc.StatusCode.INTERNAL and "injected fault" in info.value.details()
    assert faulty.proc.poll() is None
