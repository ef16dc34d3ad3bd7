"""Answers Triton's clients rely on, as Triton 2.51 gives them: the model configuration's JSON with every field at
its default (image_client reads `max_batch_size` and `format`), the extensions the server metadata lists, and the
repository API's words for loads and unloads of names the repository does not have."""

from __future__ import annotations

import json
import re

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serverproc import AFFINE_CONFIG, ServerProcess, make_repository
from tritonclient.utils import InferenceServerException

from server.protocol.grpc import pb2, pb2_grpc

UNBATCHED = ('name: "unbatched"\nbackend: "pnnx"\nmax_batch_size: 0\n'
             'input [ { name: "in0" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]\n'
             'output [ { name: "out0" data_type: TYPE_FP32 dims: [ 1, 3 ] }, '
             '{ name: "out1" data_type: TYPE_FP32 dims: [ 1, 3 ] } ]\n'
             'parameters { key: "max_shape:in0" value { string_value: "1,4" } }\n')
EXTENSIONS = ["classification", "model_repository", "schedule_policy", "model_configuration",
              "system_shared_memory", "binary_tensor_data", "parameters", "statistics", "trace", "logging"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    repo = make_repository(tmp_path_factory.mktemp("answersrepo"), {"affine": AFFINE_CONFIG,
                                                                     "unbatched": UNBATCHED})
    server = ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", "*")
    yield server
    assert server.stop() == 0, server.log_text


def test_config_json_prints_default_fields(srv):
    config = httpclient.InferenceServerClient(srv.http_url).get_model_config("unbatched")
    # what image_client's parse_model reads
    assert config["max_batch_size"] == 0
    assert config["input"][0]["format"] == "FORMAT_NONE" and config["input"][0]["dims"] == [1, 4]
    assert config["output"][0]["label_filename"] == "" and config["input"][0]["optional"] is False
    assert config["parameters"]["max_shape:in0"] == {"string_value": "1,4"}  # a string stays a string
    batched = httpclient.InferenceServerClient(srv.http_url).get_model_config("affine")
    assert batched["dynamic_batching"]["max_queue_delay_microseconds"] == 20000  # int64: a number
    assert batched["dynamic_batching"]["preferred_batch_size"] == []
    assert "sequence_batching" not in batched  # messages that are not set stay out, as in Triton


def test_extensions_are_what_the_server_implements(srv):
    assert httpclient.InferenceServerClient(srv.http_url).get_server_metadata()["extensions"] == EXTENSIONS
    assert list(grpcclient.InferenceServerClient(srv.grpc_url).get_server_metadata().extensions) == EXTENSIONS


def test_loading_and_unloading_names_the_repository_lacks(srv):
    http = httpclient.InferenceServerClient(srv.http_url)
    r = httpx.post(f"http://{srv.http_url}/v2/repository/models/ghost/load", timeout=60)
    assert r.status_code == 500 and r.json()["error"] == "failed to load 'ghost', failed to poll from model repository"
    with grpc.insecure_channel(srv.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as info:
            pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(
                pb2.RepositoryModelLoadRequest(model_name="ghost"), timeout=60)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert info.value.details() == "failed to load 'ghost', failed to poll from model repository"
    with pytest.raises(InferenceServerException, match="failed to load"):  # what simple_*_model_control match
        grpcclient.InferenceServerClient(srv.grpc_url).load_model("wrong_model_name")
    # a malformed override: simple_*_model_control match "failed to load" in the answer
    with pytest.raises(InferenceServerException, match="failed to load 'affine': config parameter: invalid model "
                                                        "config JSON"):
        http.load_model("affine", config='"parameters": {"config": {{"max_batch_size": "16"}}}')
    assert http.is_model_ready("affine")  # still serving
    http.unload_model("ghost")  # Triton 2.51: succeeds
    grpcclient.InferenceServerClient(srv.grpc_url).unload_model("ghost")
    http.unload_model("unbatched")
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'unbatched' has no available "
                                                        "versions"):
        http.get_model_metadata("unbatched")
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'ghost' is not found"):
        http.get_model_metadata("ghost")
    assert srv.proc.poll() is None


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_in_json_is_refused_in_tritons_words(srv, datatype):
    """Triton reads FP16 and BF16 only as binary data; tritonclient sends FP16 as JSON when asked (it stops BF16
    itself), so the server's refusal is what the client sees."""
    words = (f"receiving {datatype} data via JSON is not supported. Please use the binary data format for input in0")
    body = {"inputs": [{"name": "in0", "shape": [1, 4], "datatype": datatype, "data": [1, 2, 3, 4]}]}
    r = httpx.post(f"http://{srv.http_url}/v2/models/affine/infer", json=body, timeout=60)
    assert r.status_code == 400 and r.json() == {"error": words}, r.text
    if datatype == "FP16":
        inp = httpclient.InferInput("in0", [1, 4], "FP16")
        inp.set_data_from_numpy(np.arange(4, dtype=np.float16).reshape(1, 4), binary_data=False)
        with pytest.raises(InferenceServerException, match=f"{re.escape(words)}$"):
            httpclient.InferenceServerClient(srv.http_url).infer("affine", [inp])
    # the same values as binary data reach the model's checks (FP32 it takes; BF16 no model of this server takes)
    binary = {"inputs": [{"name": "in0", "shape": [1, 4], "datatype": datatype,
                          "parameters": {"binary_data_size": 8}}]}
    head = json.dumps(binary).encode()
    r = httpx.post(f"http://{srv.http_url}/v2/models/affine/infer", content=head + b"\0" * 8, timeout=60,
                   headers={"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 400 and ("data-type" if datatype == "FP16" else "unsupported datatype 'BF16'") in \
        r.json()["error"], r.text


@pytest.mark.parametrize(("key", "value"), [("priority", 2**64), ("priority", -1), ("priority", 0.5),
                                            ("timeout", 2**64), ("timeout", -1), ("timeout", "100")])
def test_priority_and_timeout_outside_uint64_are_refused_naming_the_parameter(srv, key, value):
    """Triton's priority and timeout are uint64: a value that is not one is refused (400 / INVALID_ARGUMENT) with
    the parameter's name, over REST and gRPC alike; the largest uint64 is a value like any other."""
    good = {"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    r = httpx.post(f"http://{srv.http_url}/v2/models/affine/infer", json={**good, "parameters": {key: value}},
                   timeout=60)
    assert r.status_code == 400 and f"Unable to parse '{key}'" in r.json()["error"], r.text
    if isinstance(value, int) and value >= 0:  # not expressible as a gRPC int64 or uint64 parameter
        return
    req = pb2.ModelInferRequest(model_name="affine")
    req.inputs.add(name="in0", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    kind = {int: "int64_param", float: "double_param", str: "string_param"}[type(value)]
    setattr(req.parameters[key], kind, value)
    with grpc.insecure_channel(srv.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as info:
            pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(req, timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"Unable to parse '{key}'" in info.value.details()
    r = httpx.post(f"http://{srv.http_url}/v2/models/affine/infer",
                   json={**good, "parameters": {key: 2**64 - 1}}, timeout=60)
    assert r.status_code == 200, r.text
