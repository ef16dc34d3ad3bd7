"""Work whose cost a client chooses runs off the event loop when large: classification of a big output (a million
scores took 3 s, during which /v2/health/live did not answer) and the response cache's key of big inputs (BYTES
elements are hashed one by one in Python).

Checked structurally, without timing: the work is replaced by a stand-in that blocks until a coroutine on the event
loop releases it. Run on the loop, the stand-in would wait for a coroutine that cannot run (and time out); run in a
worker thread, the loop releases it. Then a real server answers a large classification correctly."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
from pymodels import python_model
from serverproc import ServerProcess

from server import dataplane
from server import request_extensions as rx
from server.inference import OutputTensor

RELEASE_WAIT_S = 60  # generous: only reached when the work blocks the loop (the failure)


def released_by_the_loop(result):
    """A stand-in for the work, and the coroutine that releases it from the event loop."""
    gate, ran_on = threading.Event(), []

    def work(*args, **kwargs):
        ran_on.append(threading.current_thread())
        if not gate.wait(RELEASE_WAIT_S):
            raise AssertionError("the event loop never ran while the work was under way")
        return result

    async def release():
        while not ran_on:  # the work has started (in its thread)
            await asyncio.sleep(0.01)
        gate.set()

    return work, release, ran_on


def test_a_large_classification_runs_in_a_worker_thread(monkeypatch):
    work, release, ran_on = released_by_the_loop(np.array([b"1.000000:0"], np.object_))
    monkeypatch.setattr(rx, "top_classes", work)
    scores = np.zeros(rx.CLASSIFY_THREAD_ELEMENTS, np.float32)
    options = {"y": rx.OutputOptions(classes=1)}

    async def both():
        return await asyncio.gather(rx.classify([OutputTensor("y", "FP32", [scores.size], scores)], options, False,
                                                {}), release())

    (classified, _) = asyncio.run(both())
    assert classified[0].datatype == "BYTES" and ran_on[0] is not threading.main_thread()


def test_small_classifications_stay_on_the_loop(monkeypatch):
    seen = []
    monkeypatch.setattr(rx, "top_classes", lambda *a: seen.append(threading.current_thread()) or np.array([b"x"],
                                                                                                          np.object_))
    scores = np.zeros(10, np.float32)
    asyncio.run(rx.classify([OutputTensor("y", "FP32", [10], scores)], {"y": rx.OutputOptions(classes=1)}, False, {}))
    assert seen == [threading.main_thread()]


def test_the_cache_key_of_large_bytes_inputs_is_computed_in_a_worker_thread(monkeypatch):
    work, release, ran_on = released_by_the_loop(b"key")
    monkeypatch.setattr(dataplane, "cache_key", work)
    mv = SimpleNamespace(name="m", version="1", takes_requests=False)
    feed = {"s": np.array([b"a"] * (rx.THREAD_BYTES // 64), np.object_)}  # a million bytes' worth of objects

    async def both():
        return await asyncio.gather(dataplane.cache_key_off_loop(mv, feed, None), release())

    assert asyncio.run(both())[0] == b"key" and ran_on[0] is not threading.main_thread()


CLASSES_CONFIG = """
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SCORES" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
CLASSES_SOURCE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SCORES", np.arange(n, dtype=np.float32))]))
        return responses
"""


@pytest.mark.slow
def test_a_server_answers_a_large_classification(tmp_path):
    python_model(tmp_path, "scores", CLASSES_CONFIG, CLASSES_SOURCE)
    srv = ServerProcess(tmp_path)
    try:
        n, k = 200_000, 3
        body = {"inputs": [{"name": "N", "shape": [1], "datatype": "INT32", "data": [n]}],
                "outputs": [{"name": "SCORES", "parameters": {"classification": k}}]}
        r = httpx.post(f"http://{srv.http_url}/v2/models/scores/infer", json=body, timeout=120)
        assert r.status_code == 200, r.text
        out = r.json()["outputs"][0]
        assert out["datatype"] == "BYTES" and out["shape"] == [k]
        assert out["data"] == [f"{float(n - 1 - i):f}:{n - 1 - i}" for i in range(k)]  # numpy-free reference
        assert httpx.get(f"http://{srv.http_url}/v2/health/live", timeout=10).status_code == 200
    finally:
        assert srv.stop() == 0, srv.log_text
