"""REST (JSON + binary extension) and gRPC codecs, checked against tritonclient's own encoders."""

from __future__ import annotations

import gzip
import json
import re
import struct
import zlib

import numpy as np
import pytest
import tritonclient.grpc.service_pb2 as triton_pb2
import tritonclient.http as httpclient
from google.protobuf.message import DecodeError
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from server.errors import InvalidArgumentError, PayloadTooLargeError
from server.inference import InferResponse, OutputTensor
from server.protocol import grpc_codec, grpc_wire, rest_codec
from server.protocol.grpc import pb2
from server.protocol.rest.compression import decompress
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
    h.set_data_from_numpy(np.array([0.5, -2], np.float16), binary_data=True)
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


def json_request(datatype: str, data: bytes, shape: list[int] | None = None) -> bytes:
    """A request whose `data` is the JSON text `data` as given (1e400 is not something json.dumps writes)."""
    dims = json.dumps(shape if shape is not None else [len(json.loads(data))])
    return b'{"inputs": [{"name": "x", "datatype": "%s", "shape": %s, "data": %s}]}' % (
        datatype.encode(), dims.encode(), data)


@pytest.mark.parametrize("yielding", [False, True])
@pytest.mark.parametrize("datatype, data, words", [
    # what numpy would have coerced: all true, false, [1, -2], [1, 42, 0], NaN and Inf, NaN
    ("BOOL", b'["false", "0", 0.5, 2, -1]', 'element 0 is "false", not true or false'),
    ("BOOL", b"[true, 0.5]", "element 1 is 0.5, not true or false"),
    ("BOOL", b"[true, 1]", "element 1 is 1, not true or false"),
    ("BOOL", b"[null, {}]", "element 0 is null, not true or false"),
    ("INT32", b"[1.9, -2.7]", "element 0 is 1.9, not an integer"),
    ("INT32", b"[3, 2.0]", "element 1 is 2.0, not an integer"),
    ("INT32", b'[true, "42", false]', "element 0 is true, not an integer"),
    ("INT64", b'[1, "42"]', 'element 1 is "42", not an integer'),
    ("UINT8", b"[1, 1e2]", "element 1 is 100.0, not an integer"),
    ("FP32", b'[null, "1e400", 3, 4]', "element 0 is null, not a number"),
    ("FP32", b"[1, 2, 3, 1e400]", "element 3 is Infinity, outside the range of FP32"),
    ("FP32", b"[1, 1e39]", r"element 1 is 1e\+39, outside the range of FP32"),
    ("FP32", b"[1, false]", "element 1 is false, not a number"),
    ("FP64", b"[1, 1e400]", "element 1 is Infinity, outside the range of FP64"),
    ("FP64", b"[1, " + b"9" * 400 + b"]", "element 1 is 9999.*, outside the range of FP64"),
    ("INT8", b"[1, 1000]", "element 1 is 1000, outside the range of INT8"),
    ("INT8", b"[-129, 1]", "element 0 is -129, outside the range of INT8"),
    ("UINT8", b"[255, -1]", "element 1 is -1, outside the range of UINT8"),
    ("UINT16", b"[70000, 1]", "element 0 is 70000, outside the range of UINT16"),
    ("INT64", b"[9223372036854775808, 1]", "element 0 is 9223372036854775808, outside the range of INT64"),
    ("UINT64", b"[18446744073709551616, 1]", "element 0 is 18446744073709551616, outside the range of UINT64"),
])
def test_rest_json_data_is_strict(datatype, data, words, yielding):
    """Each JSON value must be what its datatype takes (Triton: integers for the integer types, true/false for
    BOOL, numbers for the floating-point ones) and within the datatype's range: never coerced or wrapped."""
    with pytest.raises(InvalidArgumentError, match=f"input 'x': data is not valid {datatype}: {words}"):
        rest_codec.decode_request("m", "", json_request(datatype, data), None, yielding=yielding)


@pytest.mark.parametrize("yielding", [False, True])
@pytest.mark.parametrize("datatype, data", [("FP16", b"[65504, -0.5]"), ("FP16", b"[1, 1e6]"), ("FP16", b"[null]"),
                                            ("BF16", b"[1.5, 2]")])
def test_rest_json_half_precision_is_refused_as_triton_does(datatype, data, yielding):
    """Triton takes FP16 and BF16 tensors only as binary data (http_server.cc ReadDataFromJson), whatever the
    values, in these words."""
    words = (f"receiving {datatype} data via JSON is not supported. Please use the binary data format for input x")
    with pytest.raises(InvalidArgumentError, match=f"^{re.escape(words)}$"):
        rest_codec.decode_request("m", "", json_request(datatype, data), None, yielding=yielding)


@pytest.mark.parametrize("yielding", [False, True])
@pytest.mark.parametrize("many", [False, True])
def test_rest_json_nan_and_infinity_are_values(yielding, many):
    """Triton's JSON parser takes NaN, Infinity and -Infinity (rapidjson's kParseNanAndInfFlag): values of the
    floating-point types, whichever parser reads the document; a number too large for the datatype is still out of
    range, and they are no integers."""
    # braces in a string: the document is parsed by the parser that counts objects
    extra = b', "parameters": {"pad": "%s"}' % (b"{" * (rest_codec.MAX_JSON_OBJECTS + 1)) if many else b""
    body = (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [[NaN, -Infinity], '
            b'[Infinity, 1.5]]}, {"name": "y", "datatype": "FP64", "shape": [1], "data": [NaN]}]%s}' % extra)
    x, y = (t.data for t in rest_codec.decode_request("m", "", body, None, yielding=yielding).inputs)
    assert x.dtype == np.float32 and y.dtype == np.float64
    np.testing.assert_array_equal(x, np.array([[np.nan, -np.inf], [np.inf, 1.5]], np.float32))
    assert np.isnan(y).all()
    for datatype, data, words in [("FP32", b"[NaN, 1e39]", r"element 1 is 1e\+39, outside the range of FP32"),
                                  ("FP64", b"[Infinity, 1e400]", "element 1 is Infinity, outside the range of FP64"),
                                  ("INT64", b"[1, -Infinity]", "element 1 is -Infinity, not an integer"),
                                  ("BOOL", b"[NaN]", "element 0 is NaN, not true or false")]:
        with pytest.raises(InvalidArgumentError, match=f"data is not valid {datatype}: {words}"):
            rest_codec.decode_request("m", "", json_request(datatype, data), None, yielding=yielding)


@pytest.mark.parametrize("yielding", [False, True])
def test_rest_json_data_strict_errors_name_the_flat_index_in_nested_and_sliced_data(yielding):
    rows = [[float(i), float(i) + 0.5] for i in range(3 * rest_codec.SLICE)]
    rows[2 * rest_codec.SLICE + 1][1] = None
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [len(rows), 2], "data": rows}]})
    index = 2 * (2 * rest_codec.SLICE + 1) + 1
    with pytest.raises(InvalidArgumentError, match=f"element {index} is null, not a number"):
        rest_codec.decode_request("m", "", body.encode(), None, yielding=yielding)


@pytest.mark.parametrize("yielding", [False, True])
@pytest.mark.parametrize("datatype, data, expected", [
    ("BOOL", b"[true, false]", np.array([True, False])),
    ("INT8", b"[-128, 127]", np.array([-128, 127], np.int8)),
    ("UINT8", b"[0, 255]", np.array([0, 255], np.uint8)),
    ("UINT64", b"[18446744073709551615, 0]", np.array([2**64 - 1, 0], np.uint64)),
    ("INT64", b"[-9223372036854775808, 7]", np.array([-(2**63), 7], np.int64)),
    ("FP32", b"[1, 2.5]", np.array([1, 2.5], np.float32)),
    ("FP64", b"[1e308, -3]", np.array([1e308, -3], np.float64)),
])
def test_rest_json_data_in_range_decodes(datatype, data, expected, yielding):
    got = rest_codec.decode_request("m", "", json_request(datatype, data), None, yielding=yielding).inputs[0].data
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("yielding", [False, True])
@pytest.mark.parametrize("data, words", [(b"[[1, 2], 3]", "differ in length"), (b"[[1, 2], [3]]", "not valid FP32"),
                                         (b"[[1, 2], [3, [4]]]", "differ in length|not valid FP32")])
def test_rest_json_ragged_data(data, words, yielding):
    with pytest.raises(InvalidArgumentError, match=words):
        rest_codec.decode_request("m", "", json_request("FP32", data, [4]), None, yielding=yielding)


@pytest.mark.parametrize("where, words", [
    ({"parameters": {"binary_data_output": "false"}}, "Unable to parse 'binary_data_output'"),
    ({"parameters": {"binary_data_output": 1}}, "Unable to parse 'binary_data_output'"),
    ({"outputs": [{"name": "a", "parameters": {"binary_data": "false"}}]}, "Unable to parse 'binary_data'"),
    ({"outputs": [{"name": "a", "parameters": {"binary_data": None}}]}, "Unable to parse 'binary_data'"),
])
def test_rest_binary_data_parameters_must_be_booleans(where, words):
    """Triton's words: the string "false" is not false (and must not count as true)."""
    with pytest.raises(InvalidArgumentError, match=f"{words}: attempt to access JSON non-boolean as boolean"):
        rest_codec.decode_request("m", "", json.dumps({"inputs": [], **where}).encode(), None)


def test_rest_json_output_of_bytes_that_are_not_utf8_asks_for_binary():
    out = [OutputTensor("s", "BYTES", [2], np.array([b"ok", b"\xff\xfe\x00"], dtype=object))]
    req = rest_codec.decode_request("m", "", b'{"inputs": []}', None)
    with pytest.raises(InvalidArgumentError, match="output 's' holds bytes that are not UTF-8 .*\"binary_data\": true"):
        rest_codec.encode_response(InferResponse("m", "1", "", out), req)
    req = rest_codec.decode_request("m", "", json.dumps({"inputs": [], "outputs": [
        {"name": "s", "parameters": {"binary_data": True}}]}).encode(), None)
    body, json_len = rest_codec.encode_response(InferResponse("m", "1", "", out), req)
    assert list(httpclient.InferResult.from_response_body(body, header_length=json_len).as_numpy("s")) == \
        [b"ok", b"\xff\xfe\x00"]
    text = [OutputTensor("s", "BYTES", [2], np.array(["é".encode(), b"\x00"], dtype=object))]
    body, _ = rest_codec.encode_response(InferResponse("m", "1", "", text),
                                         rest_codec.decode_request("m", "", b'{"inputs": []}', None))
    assert json.loads(body)["outputs"][0]["data"] == ["é", "\x00"]


@pytest.mark.parametrize("datatype, field, values, words", [
    ("INT8", "int_contents", [1, 1000], r"contents.int_contents\[1\] is 1000, outside the range of INT8 \[-128, 127\]"),
    ("INT8", "int_contents", [-129], r"contents.int_contents\[0\] is -129, outside the range of INT8"),
    ("INT16", "int_contents", [40000], r"contents.int_contents\[0\] is 40000, outside the range of INT16"),
    ("UINT8", "uint_contents", [256], r"contents.uint_contents\[0\] is 256, outside the range of UINT8"),
    ("UINT16", "uint_contents", [70000, 1], r"contents.uint_contents\[0\] is 70000, outside the range of UINT16"),
])
def test_grpc_typed_contents_out_of_range_are_refused(datatype, field, values, words):
    """numpy's cast would wrap them (INT8 1000 -> -24, UINT16 70000 -> 4464)."""
    msg = pb2.ModelInferRequest(model_name="m")
    getattr(msg.inputs.add(name="x", datatype=datatype, shape=[len(values)]).contents, field).extend(values)
    with pytest.raises(InvalidArgumentError, match=f"input 'x': {words}"):
        grpc_codec.decode_request(msg)


@pytest.mark.parametrize("datatype, field, values", [
    ("INT8", "int_contents", [-128, 127]), ("INT16", "int_contents", [-32768, 32767]),
    ("UINT8", "uint_contents", [0, 255]), ("UINT16", "uint_contents", [0, 65535]),
    ("INT32", "int_contents", [-(2**31), 2**31 - 1]), ("UINT32", "uint_contents", [0, 2**32 - 1]),
])
def test_grpc_typed_contents_at_the_range_ends(datatype, field, values):
    msg = pb2.ModelInferRequest(model_name="m")
    getattr(msg.inputs.add(name="x", datatype=datatype, shape=[2]).contents, field).extend(values)
    data = grpc_codec.decode_request(msg).inputs[0].data
    assert data.dtype == np.dtype(datatype.lower()) and data.tolist() == values


def test_gzip_request_bodies_of_several_members_are_read_whole():
    """RFC 1952: a gzip file is one or more members; all are inflated, the limit counting their total."""
    body = gzip.compress(b'{"inputs": ') + gzip.compress(b"[]}")
    assert decompress(body, "gzip") == b'{"inputs": []}'
    assert decompress(gzip.compress(b"a" * 50) * 2, "gzip", 100) == b"a" * 100
    with pytest.raises(PayloadTooLargeError, match="exceeds the 100-byte limit"):
        decompress(gzip.compress(b"a" * 60) * 2, "gzip", 100)


# mtime=0: the bodies are in the test ids, which must be the same in every pytest-xdist worker
@pytest.mark.parametrize("body, encoding, words", [
    (gzip.compress(b"{}", mtime=0) + b"junk", "gzip", "4 bytes after member 1 are not a gzip member"),
    (gzip.compress(b"{}", mtime=0) + b"\0\0", "gzip", "2 bytes after member 1 are not a gzip member"),
    (gzip.compress(b"{}" * 100, mtime=0)[:-3], "gzip", "the stream is truncated"),
    (b"", "gzip", "the stream is truncated"),
    (zlib.compress(b"{}" * 100)[:-5], "deflate", "the stream is truncated"),
    (zlib.compress(b"{}") + b"zz", "deflate", "2 bytes follow the end of the stream"),
    (zlib.compress(b"{}") * 2, "deflate", "bytes follow the end of the stream"),
    (b"not gzip", "gzip", "incorrect header check"),
    (gzip.compress(b"", mtime=0) * 1025, "gzip", "more than 1024 gzip members"),  # each member costs a decompressor
])
def test_damaged_compressed_bodies_are_refused(body, encoding, words):
    with pytest.raises(InvalidArgumentError, match=f"request body is not valid {encoding} data: .*{words}"):
        decompress(body, encoding)


def _varint(value: int) -> bytes:
    return grpc_wire._encode_varint(value)


GROUPS = {  # protobuf keeps a group of a field it does not know (or with another wire type) as unknown data
    "unknown field": _varint(99 << 3 | 3) + _varint(1 << 3) + _varint(5) + _varint(99 << 3 | 4),
    "nested": (_varint(99 << 3 | 3) + _varint(98 << 3 | 3) + _varint(2 << 3 | 2) + _varint(3) + b"abc"
               + _varint(98 << 3 | 4) + _varint(99 << 3 | 4)),
    "raw_input_contents inside": _varint(99 << 3 | 3) + _varint(7 << 3 | 2) + _varint(1) + b"z" + _varint(99 << 3 | 4),
    "on field 7": _varint(7 << 3 | 3) + _varint(7 << 3 | 4),
}
BROKEN_GROUPS = {"unclosed": _varint(99 << 3 | 3) + _varint(1 << 3) + _varint(5),
                 "end without start": _varint(99 << 3 | 4),
                 "mismatched end": _varint(99 << 3 | 3) + _varint(98 << 3 | 4),
                 "too deep for protobuf": _varint(99 << 3 | 3) * 200 + _varint(99 << 3 | 4) * 200}


def _identity_request(size: int) -> bytes:
    msg = pb2.ModelInferRequest(model_name="m")
    msg.inputs.add(name="x", datatype="UINT8", shape=[size])
    msg.raw_input_contents.append(bytes(range(256)) * (size // 256) + bytes(size % 256))
    return msg.SerializeToString()


@pytest.mark.parametrize("group", GROUPS.values(), ids=GROUPS.keys())
@pytest.mark.parametrize("size", [16, 2 * grpc_wire.SCAN_BYTES])
def test_grpc_group_fields_parse_alike_at_every_size(group, size):
    """Below SCAN_BYTES protobuf parses the message; above, grpc_wire scans it first: same outcome either way."""
    data = _identity_request(size)
    for wire in (data + group, group + data):
        parsed = grpc_wire.parse_infer_request(wire)
        assert isinstance(parsed, grpc_wire.InferMessage) == (len(wire) >= grpc_wire.SCAN_BYTES)
        req = grpc_codec.decode_request(parsed)
        assert req.model_name == "m" and req.inputs[0].data.tobytes() == pb2.ModelInferRequest.FromString(
            data).raw_input_contents[0]


@pytest.mark.parametrize("group", BROKEN_GROUPS.values(), ids=BROKEN_GROUPS.keys())
@pytest.mark.parametrize("size", [16, 2 * grpc_wire.SCAN_BYTES])
def test_grpc_broken_group_fields_are_refused_at_every_size(group, size):
    with pytest.raises(DecodeError):
        grpc_wire.parse_infer_request(_identity_request(size) + group)


def test_gzip_members_of_every_size_are_read_whole():
    """Members fed in growing pieces: a member ending inside a piece, one spanning many, 1024 of them."""
    rng = np.random.default_rng(0)
    chunks = [rng.bytes(n) for n in (0, 1, 1023, 1024, 1025, 70_000, 300_000)]
    body = b"".join(gzip.compress(c, compresslevel=1) for c in chunks)
    assert decompress(body, "gzip") == b"".join(chunks)
    assert decompress(gzip.compress(b"ab") * 1024, "gzip") == b"ab" * 1024
