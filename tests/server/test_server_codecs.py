"""REST (JSON + binary extension) and gRPC codecs, checked against tritonclient's own encoders."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import tritonclient.grpc.service_pb2 as triton_pb2
import tritonclient.http as httpclient
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from server.errors import InvalidArgumentError
from server.inference import InferResponse, OutputTensor
from server.protocol import grpc_codec, rest_codec
from server.protocol.grpc import pb2
from server.raw_tensors import decode_bytes_tensor, encode_bytes_tensor, tensor_from_raw

STRINGS = np.array([b"alpha", b"", b"\x00\xffbin", "ünï".encode()], dtype=object)


def test_bytes_wire_format_matches_tritonclient():
    ours = encode_bytes_tensor(STRINGS)
    assert ours == serialize_byte_tensor(STRINGS).item()
    assert list(decode_bytes_tensor(ours, 4, "s")) == list(deserialize_bytes_tensor(ours))
    with pytest.raises(InvalidArgumentError, match="past the end"):
        decode_bytes_tensor(struct.pack("<I", 10) + b"abc", 1, "s")
    with pytest.raises(InvalidArgumentError, match="trailing bytes"):
        decode_bytes_tensor(ours + b"x", 4, "s")


def tritonclient_http_body(inputs, outputs=None) -> tuple[bytes, int | None]:
    """The exact bytes tritonclient.http would POST."""
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    return body, json_size


def test_rest_binary_request_from_tritonclient():
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    a = httpclient.InferInput("x", [2, 3], "INT64")
    a.set_data_from_numpy(x, binary_data=True)
    s = httpclient.InferInput("s", [4], "BYTES")
    s.set_data_from_numpy(STRINGS, binary_data=True)
    h = httpclient.InferInput("h", [2], "FP16")
    h.set_data_from_numpy(np.array([0.5, -2], np.float16), binary_data=False)
    body, json_size = tritonclient_http_body([a, s, h])
    req = rest_codec.decode_request("m", "", body, json_size)
    got = {t.name: t.data for t in req.inputs}
    np.testing.assert_array_equal(got["x"], x)
    assert list(got["s"]) == list(STRINGS)
    np.testing.assert_array_equal(got["h"], np.array([0.5, -2], np.float16))


def test_rest_json_bytes_and_nested_data():
    body = json.dumps({"inputs": [{"name": "s", "shape": [2], "datatype": "BYTES", "data": ["a", "bc"]},
                                  {"name": "b", "shape": [2, 2], "datatype": "BOOL",
                                   "data": [[True, False], [False, True]]}]}).encode()
    req = rest_codec.decode_request("m", "", body, None)
    assert list(req.inputs[0].data) == [b"a", b"bc"]
    np.testing.assert_array_equal(req.inputs[1].data, [[True, False], [False, True]])


@pytest.mark.parametrize("header, body, words", [
    (None, b"[]", "must be an object"),
    (None, b'{"inputs": [{"name": "x"}]}', "'name', 'shape' and 'datatype'"),
    (None, b'{"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": []}]}', "non-negative"),
    (None, b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": ["a", "b"]}]}', "not valid FP32"),
    (None, b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP99", "data": [1]}]}', "unsupported datatype"),
    (500, b'{"inputs": []}', "outside the body"),
])
def test_rest_malformed_requests(header, body, words):
    with pytest.raises(InvalidArgumentError, match=words):
        rest_codec.decode_request("m", "", body, header)


def test_rest_binary_size_mismatch():
    head = json.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 7}}]}).encode()
    with pytest.raises(InvalidArgumentError, match="got 7 bytes"):
        rest_codec.decode_request("m", "", head + bytes(7), len(head))


def test_rest_response_binary_and_json_mix():
    out = [OutputTensor("a", "FP32", [2], np.array([1.5, 2], np.float32)),
           OutputTensor("s", "BYTES", [4], STRINGS)]
    req = rest_codec.decode_request("m", "", json.dumps({"inputs": [], "outputs": [
        {"name": "a", "parameters": {"binary_data": False}}], "parameters": {"binary_data_output": True}}).encode(),
        None)
    body, json_len = rest_codec.encode_response(InferResponse("m", "1", "id7", out), req)
    result = httpclient.InferResult.from_response_body(body, header_length=json_len)
    np.testing.assert_array_equal(result.as_numpy("a"), [1.5, 2])
    assert list(result.as_numpy("s")) == list(STRINGS)
    assert result.get_response()["id"] == "id7"


def test_grpc_request_from_tritonclient_bytes():
    """tritonclient's ModelInferRequest (its own generated classes) decodes with ours: same field numbers."""
    msg = triton_pb2.ModelInferRequest(model_name="m", model_version="2", id="r")
    msg.inputs.add(name="x", datatype="FP16", shape=[3])
    msg.raw_input_contents.append(np.array([1, 2, 3], np.float16).tobytes())
    msg.inputs.add(name="s", datatype="BYTES", shape=[4])
    msg.raw_input_contents.append(serialize_byte_tensor(STRINGS).item())
    msg.parameters["priority"].int64_param = 2
    req = grpc_codec.decode_request(pb2.ModelInferRequest.FromString(msg.SerializeToString()))
    assert (req.model_name, req.model_version, req.id, req.priority) == ("m", "2", "r", 2)
    np.testing.assert_array_equal(req.inputs[0].data, [1, 2, 3])
    assert list(req.inputs[1].data) == list(STRINGS)


def test_grpc_typed_contents_and_errors():
    msg = pb2.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="i", datatype="INT16", shape=[2, 2])
    t.contents.int_contents.extend([1, -2, 3, -4])
    b = msg.inputs.add(name="s", datatype="BYTES", shape=[2])
    b.contents.bytes_contents.extend([b"x", b"yz"])
    req = grpc_codec.decode_request(msg)
    assert req.inputs[0].data.dtype == np.int16 and req.inputs[0].data.tolist() == [[1, -2], [3, -4]]
    assert list(req.inputs[1].data) == [b"x", b"yz"]
    t.contents.int_contents.append(5)
    with pytest.raises(InvalidArgumentError, match="5 values"):
        grpc_codec.decode_request(msg)
    half = pb2.ModelInferRequest(model_name="m")
    half.inputs.add(name="h", datatype="FP16", shape=[1])
    with pytest.raises(InvalidArgumentError, match="raw_input_contents"):
        grpc_codec.decode_request(half)


def test_grpc_response_parses_with_tritonclient():
    resp = InferResponse("m", "1", "q", [OutputTensor("o", "FP32", [2, 2], np.eye(2, dtype=np.float32))])
    wire = grpc_codec.encode_response(resp).SerializeToString()
    theirs = triton_pb2.ModelInferResponse.FromString(wire)
    assert theirs.outputs[0].name == "o" and list(theirs.outputs[0].shape) == [2, 2]
    np.testing.assert_array_equal(tensor_from_raw(theirs.raw_output_contents[0], "FP32", [2, 2], "o"), np.eye(2))
