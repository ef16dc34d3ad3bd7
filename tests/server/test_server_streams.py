"""ModelStreamInfer: requests of one stream reach their model in the stream's order (a large one is decoded off the
event loop, yet a small one after it does not overtake it), decoupled requests read shared-memory inputs as any
request does, and the responses a stream has not written yet are bounded: a decoupled model flooding a client that
does not read gets its request failed and cancelled instead of filling the server's memory."""

from __future__ import annotations

import queue
import time
import uuid
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from pymodels import copy_models, python_model
from serverproc import ServerProcess
from tritonclient.grpc import service_pb2, service_pb2_grpc

PENDING_LIMIT = 4

# A sequence model counting the INPUT elements (strings) of its sequence: OUTPUT = the sequence's count so far.
ACCUMULATE_CONFIG = """
max_batch_size: 0
sequence_batching {
  direct { }
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
}
input [ { name: "INPUT" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""
ACCUMULATE_SOURCE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.totals = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key = request.correlation_id()
            if pb_utils.get_input_tensor_by_name(request, "START").as_numpy().item():
                self.totals[key] = 0
            self.totals[key] += pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().size
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT",
                                                                          np.array([self.totals[key]], np.int64))]))
        return responses
"""
# Decoupled: N responses of 128 KiB each, as fast as it can, then the final flag.
FLOOD_CONFIG = """
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_UINT8 dims: [ -1 ] } ]
"""
FLOOD_SOURCE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            for i in range(n):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.full(128 * 1024, i % 256,
                                                                                       np.uint8))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = copy_models(tmp_path_factory.mktemp("streams"), "repeat_int32")
    python_model(root, "accumulate", ACCUMULATE_CONFIG, ACCUMULATE_SOURCE)
    python_model(root, "flood", FLOOD_CONFIG, FLOOD_SOURCE)
    server = ServerProcess(root, "--allow-client-shm", "true", "--grpc-stream-max-pending-responses",
                           str(PENDING_LIMIT))
    yield server
    assert server.stop() == 0, server.log_text


class Stream:
    def __init__(self, srv: ServerProcess):
        self.client = grpcclient.InferenceServerClient(srv.grpc_url)
        self.results: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put(error or result))

    def take(self, n: int) -> list:
        return [self.results.get(timeout=120) for _ in range(n)]

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def int32_input(name: str, values: np.ndarray) -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, list(values.shape), "INT32")
    inp.set_data_from_numpy(values.astype(np.int32))
    return inp


def strings(n: int) -> grpcclient.InferInput:
    inp = grpcclient.InferInput("INPUT", [n], "BYTES")
    inp.set_data_from_numpy(np.full(n, b"x", dtype=np.object_))
    return inp


def test_a_small_request_does_not_overtake_a_large_one_of_its_sequence(srv: ServerProcess) -> None:
    before = model_stats(srv, "accumulate")
    stream = Stream(srv)
    try:
        for round_ in range(3):
            # 300,000 strings: a large message, decoded in a worker thread element by element
            stream.client.async_stream_infer("accumulate", [strings(300_000)], request_id=f"large{round_}",
                                             sequence_id=round_ + 1, sequence_start=True)
            stream.client.async_stream_infer("accumulate", [strings(5)], request_id=f"small{round_}",
                                             sequence_id=round_ + 1, sequence_end=True)
            results = stream.take(2)
            assert not any(isinstance(r, Exception) for r in results), results
            totals = {r.get_response().id: int(r.as_numpy("OUTPUT")[0]) for r in results}
            assert totals == {f"large{round_}": 300_000, f"small{round_}": 300_005}
    finally:
        stream.close()
    after = model_stats(srv, "accumulate")  # the sequence batcher's requests count as any others
    assert phase(after, "success")[0] - phase(before, "success")[0] == 6
    assert after["execution_count"] - before["execution_count"] == 6
    assert phase(after, "success")[1] >= sum(phase(after, p)[1] for p in
                                             ("queue", "compute_input", "compute_infer", "compute_output"))


def test_a_decoupled_request_reads_its_inputs_from_system_shared_memory(srv: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    name = f"dec_{uuid.uuid4().hex[:12]}"
    values = np.array([11, 22, 33], np.int32)
    handle = shm.create_shared_memory_region(name, "/" + name, values.nbytes)
    try:
        shm.set_shared_memory_region(handle, [values])
        client.register_system_shared_memory(name, "/" + name, values.nbytes)
        stream = Stream(srv)
        try:
            inp = grpcclient.InferInput("IN", [3], "INT32")
            inp.set_shared_memory(name, values.nbytes)
            delay, wait = grpcclient.InferInput("DELAY", [3], "UINT32"), grpcclient.InferInput("WAIT", [1], "UINT32")
            delay.set_data_from_numpy(np.zeros(3, np.uint32))
            wait.set_data_from_numpy(np.zeros(1, np.uint32))
            inputs = [inp, delay, wait]
            before = model_stats(srv, "repeat_int32")
            stream.client.async_stream_infer("repeat_int32", inputs)
            results = stream.take(3)
            assert not any(isinstance(r, Exception) for r in results), results
            got = sorted((int(r.as_numpy("IDX")[0]), int(r.as_numpy("OUT")[0])) for r in results)
            assert got == [(0, 11), (1, 22), (2, 33)]
            # counted once its final response is in (which the client does not ask for, so poll the statistics)
            for _ in range(12000):
                if phase(model_stats(srv, "repeat_int32"), "success")[0] > phase(before, "success")[0]:
                    break
                time.sleep(0.01)
            after = model_stats(srv, "repeat_int32")
            assert phase(after, "success")[0] == phase(before, "success")[0] + 1
            assert phase(after, "success")[1] >= sum(phase(after, p)[1] for p in
                                                     ("queue", "compute_input", "compute_infer", "compute_output"))
        finally:
            stream.close()
        client.unregister_system_shared_memory(name)
    finally:
        shm.destroy_shared_memory_region(handle)


def model_stats(srv: ServerProcess, model: str) -> dict:
    return httpx.get(f"http://{srv.http_url}/v2/models/{model}/stats", timeout=30).json()["model_stats"][0]


def phase(entry: dict, name: str) -> tuple[int, int]:
    figures = entry["inference_stats"][name]
    return int(figures.get("count", 0)), int(figures.get("ns", 0))


def failures(srv: ServerProcess, model: str) -> int:
    return phase(model_stats(srv, model), "fail")[0]


def test_a_client_that_does_not_read_a_flood_of_responses_gets_its_request_cancelled(srv: ServerProcess) -> None:
    n = 512  # 64 MiB of responses: more than the client's flow-control window and the sockets' buffers hold
    request = service_pb2.ModelInferRequest(model_name="flood", id="flood")
    tensor = request.inputs.add(name="N", datatype="INT32")
    tensor.shape.append(1)
    request.raw_input_contents.append(np.array([n], np.int32).tobytes())
    before = failures(srv, "flood")
    channel = grpc.insecure_channel(srv.grpc_url, options=[("grpc.max_receive_message_length", 2**30)])
    try:
        call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter([request]))
        # not reading: the server's writes stall, its unwritten responses reach the limit, the request fails
        for _ in range(12000):
            if failures(srv, "flood") > before:
                break
            time.sleep(0.01)
        else:
            raise AssertionError("the request never failed")
        answers = []
        for response in call:
            answers.append(response)
            if response.error_message:
                break
        call.cancel()
    finally:
        channel.close()
    assert "--grpc-stream-max-pending-responses" in answers[-1].error_message
    assert len(answers) - 1 < n
    assert all(not a.error_message for a in answers[:-1])
