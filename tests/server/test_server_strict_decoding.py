"""End to end, with tritonclient's clients (and raw httpx / grpc where a client would not send such a request): the
decoders refuse what they cannot take exactly (JSON values of the wrong type or out of range, typed gRPC contents
out of range, damaged compressed bodies, non-boolean binary_data flags), never answering with altered numbers or
bytes; and a gRPC message with a group field parses alike below and above the size where it is scanned."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.service_pb2 as triton_pb2
import tritonclient.grpc.service_pb2_grpc as triton_pb2_grpc
import tritonclient.http as httpclient
from pymodels import copy_models
from serverproc import AFFINE_CONFIG, ServerProcess, affine_reference, make_repository
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from server.protocol import grpc_wire

INT8_A = np.arange(-8, 8, dtype=np.int8)[None]
INT8_B = np.full((1, 16), 3, np.int8)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = make_repository(tmp_path_factory.mktemp("strict"), {"affine": AFFINE_CONFIG})
    srv = ServerProcess(copy_models(root, "simple_int8", "simple_identity"))
    yield srv
    assert srv.stop() == 0, srv.log_text


def post_json(srv: ServerProcess, model: str, body: bytes | dict, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"http://{srv.http_url}/v2/models/{model}/infer", content=content, headers=headers, timeout=60)


def int8_body(first: str) -> bytes:
    """simple_int8's request with INPUT0's `data` as the JSON text `first` (16 values)."""
    second = json.dumps(INT8_B.ravel().tolist())
    return (b'{"inputs": [{"name": "INPUT0", "datatype": "INT8", "shape": [1, 16], "data": %s}, '
            b'{"name": "INPUT1", "datatype": "INT8", "shape": [1, 16], "data": %s}]}' % (first.encode(),
                                                                                      second.encode()))


@pytest.mark.parametrize("model, body, words", [
    ("simple_int8", int8_body(json.dumps([1.9] + [0] * 15)), "input 'INPUT0': data is not valid INT8: element 0 is "
                                                             "1.9, not an integer"),
    ("simple_int8", int8_body(json.dumps([0] * 15 + [True])), "element 15 is true, not an integer"),
    ("simple_int8", int8_body(json.dumps([0] * 3 + [1000] + [0] * 12)), "element 3 is 1000, outside the range of "
                                                                        "INT8"),
    ("simple_int8", int8_body(json.dumps(["42"] + [0] * 15)), 'element 0 is "42", not an integer'),
    ("affine", b'{"inputs": [{"name": "in0", "datatype": "FP32", "shape": [1, 4], "data": [null, "1e400", 3, 4]}]}',
     "input 'in0': data is not valid FP32: element 0 is null, not a number"),
    ("affine", b'{"inputs": [{"name": "in0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 1e400]}]}',
     "element 3 is Infinity, outside the range of FP32"),
])
def test_rest_json_values_numpy_would_coerce_are_refused(server, model, body, words):
    answer = post_json(server, model, body)
    assert answer.status_code == 400 and words in answer.json()["error"], answer.text


@pytest.mark.parametrize("binary", [False, True])
def test_rest_int8_json_data_from_tritonclient(server, binary):
    """In-range values still decode exactly (checked against numpy)."""
    inputs = [httpclient.InferInput(name, [1, 16], "INT8") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(INT8_A, binary_data=binary)
    inputs[1].set_data_from_numpy(INT8_B, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = httpclient.InferenceServerClient(server.http_url).infer("simple_int8", inputs, outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), INT8_A + INT8_B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), INT8_A - INT8_B)


def identity_http(srv: ServerProcess, data: np.ndarray, binary_output: bool):  # noqa: ANN201 - InferResult
    inp = httpclient.InferInput("INPUT0", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_output)
    return httpclient.InferenceServerClient(srv.http_url).infer("simple_identity", [inp], outputs=[out])


def test_rest_bytes_that_are_not_utf8_are_never_altered_in_json(server):
    data = np.array([[b"ok", b"\xff\xfe\x00"]], dtype=object)
    with pytest.raises(InferenceServerException) as info:
        identity_http(server, data, binary_output=False)
    assert info.value.status() == "400"
    assert "output 'OUTPUT0' holds bytes that are not UTF-8" in info.value.message()
    assert '"binary_data": true' in info.value.message()
    assert list(identity_http(server, data, binary_output=True).as_numpy("OUTPUT0")[0]) == [b"ok", b"\xff\xfe\x00"]
    text = np.array([["\u00e9t\u00e9".encode(), b"a\x00b"]], dtype=object)
    # tritonclient gives a JSON BYTES output as the strings it read
    assert list(identity_http(server, text, binary_output=False).as_numpy("OUTPUT0")[0]) == ["\u00e9t\u00e9", "a\x00b"]


AFFINE_X = np.arange(4, dtype=np.float32).reshape(1, 4) / 3
AFFINE_BODY = {"inputs": [{"name": "in0", "datatype": "FP32", "shape": [1, 4], "data": AFFINE_X.ravel().tolist()}]}


@pytest.mark.parametrize("where, key", [({"parameters": {"binary_data_output": "false"}}, "binary_data_output"),
                                        ({"outputs": [{"name": "out0", "parameters": {"binary_data": "false"}}]},
                                         "binary_data")])
def test_rest_binary_data_flags_must_be_booleans(server, where, key):
    answer = post_json(server, "affine", {**AFFINE_BODY, **where})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == f"Unable to parse '{key}': attempt to access JSON non-boolean as boolean"


def test_rest_gzip_body_of_two_members_and_damaged_bodies(server):
    body = json.dumps(AFFINE_BODY).encode()
    answer = post_json(server, "affine", gzip.compress(body[:20]) + gzip.compress(body[20:]), **{
        "Content-Encoding": "gzip"})
    assert answer.status_code == 200, answer.text
    out = {o["name"]: np.array(o["data"], np.float32) for o in answer.json()["outputs"]}
    np.testing.assert_allclose(out["out1"], affine_reference(AFFINE_X)["out1"].ravel(), rtol=1e-5, atol=1e-6)
    for damaged, words in ((gzip.compress(body) + b"junk", "4 bytes after member 1 are not a gzip member"),
                           (gzip.compress(body)[:-6], "the stream is truncated")):
        answer = post_json(server, "affine", damaged, **{"Content-Encoding": "gzip"})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"].startswith("request body is not valid gzip data: ") and \
            words in answer.json()["error"], answer.text


def typed_int8_request(first: list[int]) -> triton_pb2.ModelInferRequest:
    msg = triton_pb2.ModelInferRequest(model_name="simple_int8")
    msg.inputs.add(name="INPUT0", datatype="INT8", shape=[1, 16]).contents.int_contents.extend(first)
    msg.inputs.add(name="INPUT1", datatype="INT8", shape=[1, 16]).contents.int_contents.extend(INT8_B.ravel().tolist())
    return msg


def test_grpc_typed_contents_out_of_range_are_refused(server):
    """tritonclient sends raw contents only: the typed ones go through its generated stub."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = triton_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(typed_int8_request([0] * 5 + [1000] + [0] * 10), timeout=60)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == ("input 'INPUT0': contents.int_contents[5] is 1000, outside the range of INT8 "
                                        "[-128, 127]")
        reply = stub.ModelInfer(typed_int8_request(INT8_A.ravel().tolist()), timeout=60)
    sums = np.frombuffer(reply.raw_output_contents[0], np.int8).reshape(1, 16)
    np.testing.assert_array_equal(sums, INT8_A + INT8_B)
    # and the same values through tritonclient (raw contents)
    inputs = [grpcclient.InferInput(name, [1, 16], "INT8") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(INT8_A)
    inputs[1].set_data_from_numpy(INT8_B)
    result = grpcclient.InferenceServerClient(server.grpc_url).infer("simple_int8", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), INT8_A - INT8_B)


def _tag(field: int, wire_type: int) -> bytes:
    return grpc_wire._encode_varint(field << 3 | wire_type)


@pytest.mark.parametrize("size", [16, 2 * grpc_wire.SCAN_BYTES])
def test_grpc_group_field_is_kept_as_unknown_at_every_size(server, size):
    """A message with a group of an unknown field number (wire types 3/4) is answered alike whether protobuf parses
    it whole (small) or grpc_wire scans it first (64 KiB or more)."""
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    msg = triton_pb2.ModelInferRequest(model_name="simple_identity")
    msg.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 1])
    msg.raw_input_contents.append(serialize_byte_tensor(np.array([payload], dtype=object)).item())
    group = _tag(99, 3) + _tag(1, 0) + b"\x05" + _tag(98, 3) + _tag(2, 2) + b"\x03abc" + _tag(98, 4) + _tag(99, 4)
    with grpc.insecure_channel(server.grpc_url, options=[("grpc.max_receive_message_length", 1 << 24)]) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                   response_deserializer=triton_pb2.ModelInferResponse.FromString)
        for wire in (msg.SerializeToString() + group, group + msg.SerializeToString()):
            reply = call(wire, timeout=60)
            assert reply.raw_output_contents[0] == msg.raw_input_contents[0]
        with pytest.raises(grpc.RpcError) as info:
            call(msg.SerializeToString() + _tag(99, 3), timeout=60)  # never closed
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
