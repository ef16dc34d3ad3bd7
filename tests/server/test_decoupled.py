"""Decoupled models (0..n responses per request) on gRPC streams, as Triton serves them: every response carries
the `triton_final_response` parameter, the final flag alone reaches only a client that asked for it
(`triton_enable_empty_final_response`), errors come as stream responses and the stream goes on. Over HTTP and the
non-streaming ModelInfer a decoupled model is refused with Triton's words."""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from pymodels import copy_models, python_model
from serverproc import ServerProcess
from tritonclient.utils import InferenceServerException

# Sends one response, then its process crashes (in the thread that sends the responses, after execute returned).
CRASH_CONFIG = """
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
CRASH_SOURCE = """
import ctypes
import threading

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            threading.Thread(target=self.respond, args=(sender, values)).start()

    def respond(self, sender, values):
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", values)]))
        ctypes.string_at(0)
"""


# Streams responses until its request is cancelled (or a bound is reached), then writes what it saw to the file
# named by its "marker" parameter.
UNTIL_CANCELLED_CONFIG = CRASH_CONFIG + 'parameters { key: "marker" value { string_value: "%s" } }\n'
UNTIL_CANCELLED_SOURCE = """
import json
import os
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

BOUND = 20000


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.marker = config["parameters"]["marker"]["string_value"]

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.stream, args=(request,)).start()

    def stream(self, request):
        sender = request.get_response_sender()
        before = request.is_cancelled()
        sent = 0
        while not sender.is_cancelled() and sent < BOUND:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([sent], np.int32))]))
            sent += 1
            threading.Event().wait(0.002)
        seen = {"before": before, "request": request.is_cancelled(), "sender": sender.is_cancelled(),
                "sent": sent}
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        with open(self.marker + ".tmp", "w") as f:
            json.dump(seen, f)
        os.replace(self.marker + ".tmp", self.marker)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = copy_models(tmp_path_factory.mktemp("decoupled"), "repeat_int32", "simple")
    python_model(root, "crash_after_one", CRASH_CONFIG, CRASH_SOURCE)
    marker = tmp_path_factory.mktemp("marker") / "seen.json"
    python_model(root, "until_cancelled", UNTIL_CANCELLED_CONFIG % marker, UNTIL_CANCELLED_SOURCE)
    srv = ServerProcess(root)
    yield srv
    assert srv.stop() == 0, srv.log_text


def repeat_inputs(mod, values: list[int], wait_ms: int = 0):  # noqa: ANN001, ANN201
    arrays = {"IN": np.array(values, np.int32), "DELAY": np.full(len(values), 5, np.uint32),
              "WAIT": np.array([wait_ms], np.uint32)}
    types = {"IN": "INT32", "DELAY": "UINT32", "WAIT": "UINT32"}
    inputs = []
    for name, array in arrays.items():
        inputs.append(mod.InferInput(name, list(array.shape), types[name]))
        inputs[-1].set_data_from_numpy(array)
    return inputs


class Stream:
    """A gRPC stream whose results (or errors) arrive in a queue."""

    def __init__(self, srv: ServerProcess):
        self.client = grpcclient.InferenceServerClient(srv.grpc_url)
        self.results: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put(error or result))

    def send(self, model: str, inputs, **kwargs) -> None:  # noqa: ANN001, ANN003
        self.client.async_stream_infer(model, inputs, **kwargs)

    def take(self, n: int) -> list:
        return [self.results.get(timeout=60) for _ in range(n)]

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def final_flag(result) -> bool:  # noqa: ANN001
    return result.get_response().parameters["triton_final_response"].bool_param


def test_repeat_sends_one_response_per_element_in_order(server):
    stream = Stream(server)
    try:
        stream.send("repeat_int32", repeat_inputs(grpcclient, list(range(100, 110)), wait_ms=20))
        results = stream.take(10)
    finally:
        stream.close()
    assert [int(r.as_numpy("OUT")[0]) for r in results] == list(range(100, 110))
    assert [int(r.as_numpy("IDX")[0]) for r in results] == list(range(10))
    assert not any(final_flag(r) for r in results)
    assert stream.results.empty()  # the final flag alone was not asked for


def test_the_final_flag_alone_when_asked_for(server):
    stream = Stream(server)
    try:
        stream.send("repeat_int32", repeat_inputs(grpcclient, [7, 8]), request_id="r1",
                    enable_empty_final_response=True)
        stream.send("repeat_int32", repeat_inputs(grpcclient, []), request_id="r0", enable_empty_final_response=True)
        results = stream.take(4)
    finally:
        stream.close()
    by_id: dict[str, list] = {}
    for r in results:
        by_id.setdefault(r.get_response().id, []).append(r)
    assert [final_flag(r) for r in by_id["r1"]] == [False, False, True]
    assert [int(r.as_numpy("OUT")[0]) for r in by_id["r1"][:2]] == [7, 8]
    assert by_id["r1"][2].as_numpy("OUT") is None and by_id["r1"][2].get_response().model_name == "repeat_int32"
    assert len(by_id["r0"]) == 1 and final_flag(by_id["r0"][0])  # no response at all: the flag alone


def test_requests_on_one_stream_run_concurrently(server):
    """Both requests' responses interleave (WAIT 0: execute returns at once, the responses follow)."""
    stream = Stream(server)
    try:
        stream.send("repeat_int32", repeat_inputs(grpcclient, [1, 2, 3]), request_id="a")
        stream.send("repeat_int32", repeat_inputs(grpcclient, [4, 5, 6]), request_id="b")
        results = stream.take(6)
    finally:
        stream.close()
    got = {rid: [int(r.as_numpy("OUT")[0]) for r in results if r.get_response().id == rid] for rid in "ab"}
    assert got == {"a": [1, 2, 3], "b": [4, 5, 6]}


def test_an_error_response_on_the_stream_and_the_stream_goes_on(server):
    stream = Stream(server)
    try:
        bad = repeat_inputs(grpcclient, [1, 2])
        delay = grpcclient.InferInput("DELAY", [3], "UINT32")
        delay.set_data_from_numpy(np.zeros(3, np.uint32))
        stream.send("repeat_int32", [bad[0], delay, bad[2]])
        (error,) = stream.take(1)
        stream.send("simple", simple_inputs(grpcclient))
        (ok,) = stream.take(1)
    finally:
        stream.close()
    assert isinstance(error, InferenceServerException)
    assert "expected IN and DELAY shape to match, got [2] and [3]" in error.message()
    np.testing.assert_array_equal(ok.as_numpy("OUTPUT0"), np.arange(16, dtype=np.int32)[None] + 1)
    assert final_flag(ok)  # a model that is not decoupled: one response, the final one


def test_a_worker_crash_ends_its_open_requests_with_the_reason(server):
    stream = Stream(server)
    try:
        stream.send("crash_after_one", [_int32("IN", [5])])
        first, error = stream.take(2)
    finally:
        stream.close()
    assert int(first.as_numpy("OUT")[0]) == 5
    assert isinstance(error, InferenceServerException)
    assert "instance crash_after_one_0_0: the Python process was killed by signal SIGSEGV" in error.message()


def test_http_and_model_infer_refuse_a_decoupled_model(server):
    with pytest.raises(InferenceServerException) as info:
        httpclient.InferenceServerClient(server.http_url).infer("repeat_int32", repeat_inputs(httpclient, [1]))
    assert info.value.status() == "501"
    assert info.value.message() == "HTTP end point doesn't support models with decoupled transaction policy"
    with pytest.raises(InferenceServerException) as info:
        grpcclient.InferenceServerClient(server.grpc_url).infer("repeat_int32", repeat_inputs(grpcclient, [1]))
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert info.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    answer = httpx.post(f"http://{server.http_url}/v2/models/repeat_int32/infer", timeout=30, json={"inputs": [
        {"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]})
    assert answer.status_code == 501 and "decoupled transaction policy" in answer.json()["error"]


def test_a_client_that_cancels_its_stream_cancels_the_models_request(server):
    """Triton's request.is_cancelled() and response_sender.is_cancelled(): False while the client reads, True once
    it cancels its stream, so a generating model can stop instead of running for nobody."""
    config = httpx.get(f"http://{server.http_url}/v2/models/until_cancelled/config", timeout=30).json()
    marker = Path(config["parameters"]["marker"]["string_value"])
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put(error or result))
    try:
        client.async_stream_infer("until_cancelled", [_int32("IN", [1])])
        got = [results.get(timeout=60) for _ in range(3)]
        assert [int(r.as_numpy("OUT")[0]) for r in got] == [0, 1, 2]
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert time.monotonic() < deadline, "the model never saw its request cancelled"
        time.sleep(0.05)
    seen = json.loads(marker.read_text())
    assert seen["before"] is False and seen["request"] is True and seen["sender"] is True
    assert 3 <= seen["sent"] < 20000


def test_decoupled_requests_count_in_the_statistics(server):
    c = httpclient.InferenceServerClient(server.http_url)
    before = c.get_inference_statistics("repeat_int32")["model_stats"][0]["inference_stats"]["success"]["count"]
    stream = Stream(server)
    try:
        stream.send("repeat_int32", repeat_inputs(grpcclient, [1]), enable_empty_final_response=True)
        stream.take(2)
    finally:
        stream.close()
    after = c.get_inference_statistics("repeat_int32")["model_stats"][0]["inference_stats"]["success"]["count"]
    assert after == before + 1
    assert c.get_model_config("repeat_int32")["model_transaction_policy"] == {"decoupled": True}


def simple_inputs(mod):  # noqa: ANN001, ANN201
    return [_int32("INPUT0", np.arange(16)[None], mod), _int32("INPUT1", np.ones((1, 16)), mod)]


def _int32(name: str, values, mod=grpcclient):  # noqa: ANN001, ANN202
    array = np.asarray(values, np.int32)
    tensor = mod.InferInput(name, list(array.shape), "INT32")
    tensor.set_data_from_numpy(array)
    return tensor
