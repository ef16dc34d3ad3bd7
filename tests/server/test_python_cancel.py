"""A default-mode Python model's request.is_cancelled(), as Triton's Python backend gives it: False while the client
waits, True once the client goes away during execute (an HTTP client that hangs up, a gRPC deadline), so a long
execute can stop working for nobody. Each request names, in its "marker" parameter, the file the model writes what
it saw into."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from pymodels import python_model
from serverproc import ServerProcess
from tritonclient.utils import InferenceServerException

CONFIG = """
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
# IN = 1: waits until its request is cancelled (at most BOUND seconds), then writes what it saw; IN = 0 answers
# at once.
SOURCE = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

BOUND = 120.0


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            if int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0]) == 0:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([0], np.int32))]))
                continue
            marker = json.loads(request.parameters())["marker"]
            before = request.is_cancelled()
            end = time.monotonic() + BOUND
            while not request.is_cancelled() and time.monotonic() < end:
                time.sleep(0.01)
            seen = {"before": before, "cancelled": request.is_cancelled()}
            with open(marker + ".tmp", "w") as f:
                json.dump(seen, f)
            os.replace(marker + ".tmp", marker)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))]))
        return responses
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("pycancel")
    python_model(root, "waits_for_cancel", CONFIG, SOURCE)
    srv = ServerProcess(root)
    yield srv
    assert srv.stop() == 0, srv.log_text


def wait_for(marker: Path) -> dict:
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert time.monotonic() < deadline, "the model never saw its request cancelled"
        time.sleep(0.05)
    return json.loads(marker.read_text())


def test_an_http_client_that_hangs_up_cancels_the_running_request(server, tmp_path):
    marker = tmp_path / "http.json"
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}],
            "parameters": {"marker": str(marker)}}
    with pytest.raises(httpx.ReadTimeout):  # the model answers only once cancelled: the client gives up first
        httpx.post(f"http://{server.http_url}/v2/models/waits_for_cancel/infer", json=body,
                   timeout=httpx.Timeout(30, read=1.0))
    assert wait_for(marker) == {"before": False, "cancelled": True}


def test_a_grpc_deadline_cancels_the_running_request(server, tmp_path):
    marker = tmp_path / "grpc.json"
    inp = grpcclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], np.int32))
    with pytest.raises(InferenceServerException) as info:
        grpcclient.InferenceServerClient(server.grpc_url).infer("waits_for_cancel", [inp], client_timeout=1.0,
                                                                  parameters={"marker": str(marker)})
    assert "Deadline" in str(info.value) or "DEADLINE" in str(info.value.status())
    assert wait_for(marker) == {"before": False, "cancelled": True}
    # the instance is free again: a request that answers at once runs (after the cancelled one, if it still runs)
    inp.set_data_from_numpy(np.array([0], np.int32))
    answer = grpcclient.InferenceServerClient(server.grpc_url).infer("waits_for_cancel", [inp], client_timeout=60)
    assert answer.as_numpy("OUT").tolist() == [0]
