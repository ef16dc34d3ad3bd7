"""Triton's Python backend against a real server with tritonclient: users' model.py files (TritonPythonModel,
triton_python_backend_utils) run unmodified, each instance in a worker process of its own. BYTES tensors end to end
(Triton's simple_string and simple_identity examples), errors, auto_complete_config, BLS calls to other models, and
a worker that crashes, exits or hangs: its requests fail with the reason, the server and the other models carry
on, and the next request gets a fresh worker."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from pymodels import (
    AUTO_CONFIG,
    AUTO_SOURCE,
    BLS_CONFIG,
    BLS_SOURCE,
    FAULTY_CONFIG,
    FAULTY_SOURCE,
    STOPPER_CONFIG,
    STOPPER_SOURCE,
    copy_models,
    python_model,
)
from serverproc import ServerProcess
from tritonclient.utils import InferenceServerException

CLIENTS = {"http": httpclient, "grpc": grpcclient}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = copy_models(tmp_path_factory.mktemp("pyrepo"), "simple", "simple_string", "simple_identity",
                       "custom_identity_int32", "repeat_int32")
    python_model(root, "faulty", FAULTY_CONFIG, FAULTY_SOURCE)
    python_model(root, "bls", BLS_CONFIG, BLS_SOURCE)
    python_model(root, "auto", AUTO_CONFIG, AUTO_SOURCE)
    python_model(root, "stopper", STOPPER_CONFIG, STOPPER_SOURCE)
    srv = ServerProcess(root)
    yield srv
    assert srv.stop() == 0, srv.log_text


def client(srv: ServerProcess, protocol: str):  # noqa: ANN201 - either client
    url = srv.http_url if protocol == "http" else srv.grpc_url
    return CLIENTS[protocol].InferenceServerClient(url)


def infer(srv: ServerProcess, protocol: str, model: str, arrays: dict[str, np.ndarray], datatypes: dict[str, str],
          outputs: list[str] | None = None, **kwargs):  # noqa: ANN003, ANN201
    mod = CLIENTS[protocol]
    inputs = []
    for name, array in arrays.items():
        inputs.append(mod.InferInput(name, list(array.shape), datatypes[name]))
        inputs[-1].set_data_from_numpy(array)
    wanted = [mod.InferRequestedOutput(n) for n in outputs] if outputs else None
    return client(srv, protocol).infer(model, inputs, outputs=wanted, **kwargs)


def strings(values: np.ndarray) -> np.ndarray:
    return np.vectorize(lambda v: str(v).encode(), otypes=[object])(values)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_simple_string_adds_integers_written_as_strings(server, protocol):
    a, b = np.arange(16, dtype=np.int32)[None], np.ones((1, 16), np.int32)
    result = infer(server, protocol, "simple_string", {"INPUT0": strings(a), "INPUT1": strings(b)},
                   {"INPUT0": "BYTES", "INPUT1": "BYTES"}, ["OUTPUT0", "OUTPUT1"])
    assert [int(v) for v in result.as_numpy("OUTPUT0").reshape(-1)] == list((a + b).reshape(-1))
    assert [int(v) for v in result.as_numpy("OUTPUT1").reshape(-1)] == list((a - b).reshape(-1))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("data", [np.array([[b"he\x00llo"] * 16], dtype=object),
                                  np.array([[b"\x00\x01\x02\x03"] * 16], dtype=np.bytes_),
                                  np.array([[b"", "\u00e9t\u00e9".encode(), b"\xff\xfe"]], dtype=object)])
def test_simple_identity_returns_every_byte(server, protocol, data):
    result = infer(server, protocol, "simple_identity", {"INPUT0": data}, {"INPUT0": "BYTES"})
    out = result.as_numpy("OUTPUT0")
    assert out.shape == data.shape and [bytes(v) for v in out.reshape(-1)] == [bytes(v) for v in data.reshape(-1)]


def test_bytes_in_http_json(server):
    """The JSON form of a BYTES tensor (strings in `data`) reaches the model and comes back as JSON strings."""
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "BYTES", "data": ["a b", "\u00e9"]}]}
    answer = httpx.post(f"http://{server.http_url}/v2/models/simple_identity/infer", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == ["a b", "\u00e9"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_batch_of_variable_length_int32(server, protocol):
    data = np.arange(3 * 7, dtype=np.int32).reshape(3, 7)
    result = infer(server, protocol, "custom_identity_int32", {"INPUT0": data}, {"INPUT0": "INT32"})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def faulty(srv: ServerProcess, value: int, protocol: str = "http"):  # noqa: ANN201
    return infer(srv, protocol, "faulty", {"IN": np.array([value], np.int32)}, {"IN": "INT32"})


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_error_response_keeps_its_code_and_message(server, protocol):
    with pytest.raises(InferenceServerException) as info:
        faulty(server, 11, protocol)
    assert "value 11 is refused" in info.value.message()
    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


def test_an_exception_fails_the_request_with_its_message(server):
    with pytest.raises(InferenceServerException) as info:
        faulty(server, 22)
    message = info.value.message()
    assert message.startswith("Failed to process the request(s) for model 'faulty_0_0', message: ValueError: "
                              "cannot take 22"), message
    assert info.value.status() == "500"
    assert int(faulty(server, 20).as_numpy("OUT")[0]) == 21  # the worker carries on


@pytest.mark.parametrize("value, words", [(33, "was killed by signal SIGSEGV"), (44, "exited with status 3")])
def test_a_worker_that_dies_fails_its_request_and_is_started_again(server, value, words):
    before = int(faulty(server, 0).as_numpy("PID")[0])
    with pytest.raises(InferenceServerException) as info:
        faulty(server, value)
    assert "model 'faulty' instance faulty_0_0: the Python process " + words in info.value.message()
    assert info.value.status() == "500"
    again = faulty(server, 50)
    assert int(again.as_numpy("OUT")[0]) == 51 and int(again.as_numpy("PID")[0]) != before
    simple = infer(server, "grpc", "simple_identity", {"INPUT0": np.array([[b"x"]], dtype=object)},
                   {"INPUT0": "BYTES"})
    assert simple.as_numpy("OUTPUT0")[0, 0] == b"x"


def test_a_hung_worker_is_killed_after_its_timeout(server):
    """The model's timeout (nnserve_python_timeout_secs, 4 s here) bounds a call; the hung process is killed and its
    request fails, and the server answers others meanwhile."""
    pid = int(faulty(server, 0).as_numpy("PID")[0])
    with pytest.raises(InferenceServerException) as info:
        faulty(server, 55)
    assert "did not answer 'execute' within 4 s" in info.value.message()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert int(faulty(server, 60).as_numpy("OUT")[0]) == 61
    assert "faulty_0_0: starting a new Python process" in server.log_text


def stopper(srv: ServerProcess, value: int, pad_bytes: int = 1):  # noqa: ANN201
    return infer(srv, "http", "stopper", {"IN": np.array([value], np.int32), "PAD": np.zeros(pad_bytes, np.uint8)},
                 {"IN": "INT32", "PAD": "UINT8"})


def _wait_stopped(pid: int) -> None:
    """Until the process is in state T (stopped); the model stops itself a moment after answering."""
    stat = Path(f"/proc/{pid}/stat")
    for _ in range(600):
        if stat.read_text().rsplit(")", 1)[1].split()[0] == "T":
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} did not stop")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_a_worker_that_stops_reading_is_killed_not_waited_for(server):
    """A request too large for the socket's buffer, to a worker that reads nothing any more, fails after the model's
    timeout (the process is killed) instead of blocking the server's call thread forever; the next request gets a
    fresh worker."""
    pid = int(stopper(server, 1).as_numpy("PID")[0])
    _wait_stopped(pid)
    with pytest.raises(InferenceServerException) as info:
        stopper(server, 0, pad_bytes=32 * 2**20)
    assert "did not take 'execute' within 4 s (it stopped reading its link); killed" in info.value.message()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    again = stopper(server, 7)
    assert int(again.as_numpy("OUT")[0]) == 7 and int(again.as_numpy("PID")[0]) != pid


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_calls_another_model_of_the_server(server, protocol):
    a, b = np.arange(16, dtype=np.int32), np.full(16, 3, np.int32)
    result = infer(server, protocol, "bls", {"INPUT0": a, "INPUT1": b, "MODE": np.array([0], np.int32)},
                   {"INPUT0": "INT32", "INPUT1": "INT32", "MODE": "INT32"})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_bls_async_exec_and_decoupled_exec(server):
    a, b = np.arange(16, dtype=np.int32), np.full(16, 3, np.int32)
    types = {"INPUT0": "INT32", "INPUT1": "INT32", "MODE": "INT32"}
    result = infer(server, "http", "bls", {"INPUT0": a, "INPUT1": b, "MODE": np.array([3], np.int32)}, types)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), b - a)
    result = infer(server, "http", "bls", {"INPUT0": a, "INPUT1": b, "MODE": np.array([2], np.int32)}, types)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a)  # repeat_int32's 16 responses, in order


def test_a_bls_call_to_an_unknown_model_is_an_error_response(server):
    with pytest.raises(InferenceServerException) as info:
        infer(server, "http", "bls", {"INPUT0": np.zeros(16, np.int32), "INPUT1": np.zeros(16, np.int32),
                                      "MODE": np.array([1], np.int32)},
              {"INPUT0": "INT32", "INPUT1": "INT32", "MODE": "INT32"})
    assert "Request for unknown model: 'no_such_model' is not found" in info.value.message()


def test_bls_calls_count_in_the_called_model_statistics(server):
    stats = client(server, "http").get_inference_statistics("simple")["model_stats"][0]
    before = stats["inference_stats"]["success"]["count"]
    infer(server, "http", "bls", {"INPUT0": np.zeros(16, np.int32), "INPUT1": np.zeros(16, np.int32),
                                  "MODE": np.array([0], np.int32)},
          {"INPUT0": "INT32", "INPUT1": "INT32", "MODE": "INT32"})
    stats = client(server, "http").get_inference_statistics("simple")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == before + 1


def test_auto_complete_config_describes_the_model(server):
    meta = client(server, "http").get_model_metadata("auto")
    assert meta["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 3]}]
    assert [o["name"] for o in meta["outputs"]] == ["Y", "INFO"]
    config = client(server, "grpc").get_model_config("auto").config
    assert config.max_batch_size == 4 and config.HasField("dynamic_batching") and config.backend == "python"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_model_sees_the_request_id_parameters_and_requested_outputs(server, protocol):
    x = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    result = infer(server, protocol, "auto", {"X": x}, {"X": "FP32"}, ["Y", "INFO"], request_id="req-7",
                   parameters={"mode": "fast", "level": 3})
    np.testing.assert_allclose(result.as_numpy("Y"), x * 2.5)
    info = json.loads(result.as_numpy("INFO")[0, 0])
    assert info == {"id": "req-7", "parameters": {"mode": "fast", "level": 3}, "outputs": ["INFO", "Y"]}


def test_python_model_statistics(server):
    before = client(server, "http").get_inference_statistics("faulty")["model_stats"][0]["inference_stats"]
    faulty(server, 70)
    with pytest.raises(InferenceServerException):
        faulty(server, 11)  # refused by the model: a failure of its own, whichever tests ran before on this server
    stats = client(server, "http").get_inference_statistics("faulty")["model_stats"][0]
    after = stats["inference_stats"]
    assert after["success"]["count"] - before["success"]["count"] == 1 and stats["execution_count"] >= 1
    assert after["fail"]["count"] - before["fail"]["count"] == 1


def test_a_model_whose_initialize_fails_does_not_load(tmp_path):
    python_model(tmp_path, "broken", 'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                                     'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n', """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def initialize(self, args):
                raise pb_utils.TritonModelException("the weights file is missing")

            def execute(self, requests):
                return []
        """)
    python_model(tmp_path, "not_a_model", "", "x = 1\n")
    srv = ServerProcess(tmp_path, "--exit-on-error", "false", "--strict-readiness", "false")
    try:
        index = {r["name"]: r for r in client(srv, "http").get_model_repository_index()}
        assert index["broken"]["state"] == "UNAVAILABLE"
        assert "instance broken_0_0: initialize failed: the weights file is missing" in index["broken"]["reason"]
        assert "model.py defines no class TritonPythonModel" in index["not_a_model"]["reason"]
    finally:
        assert srv.stop() == 0, srv.log_text


def test_unloading_stops_the_worker_processes(tmp_path):
    python_model(tmp_path, "faulty", FAULTY_CONFIG + "instance_group [ { count: 2 kind: KIND_CPU } ]\n",
                 FAULTY_SOURCE)
    srv = ServerProcess(tmp_path, "--model-control-mode", "explicit", "--load-model", "faulty")
    try:
        c = client(srv, "http")
        pids = {int(faulty(srv, 0).as_numpy("PID")[0]) for _ in range(6)}
        assert pids, pids
        c.unload_model("faulty")
        for pid in pids:
            _wait_gone(pid)
    finally:
        assert srv.stop() == 0, srv.log_text


def _wait_gone(pid: int) -> None:
    """Unload returns once the instances are closed: by then the process is reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return
    status = Path(f"/proc/{pid}/status")
    assert not status.exists() or "zombie" in status.read_text(), f"worker {pid} still runs"
