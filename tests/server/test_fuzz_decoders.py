"""Property-based fuzzing of the REST and gRPC request decoders (hypothesis): whatever the bytes, a decoder returns
a request whose every tensor holds exactly what its shape says, or raises a ServerError (a 4xx the client sees);
nothing else, and never slowly (a decoder that sized something from a claimed shape would blow the deadline).

Bounded here (NNSERVE_FUZZ_EXAMPLES per property, 150 by default); `make fuzz-server` runs it long. A crash found
becomes a case in test_reliability_hostile.py or test_reliability_battery_*.py."""

from __future__ import annotations

import json
import math
import os
import struct

import numpy as np
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.errors import ServerError
from server.inference import InferRequest
from server.protocol import grpc_codec, grpc_wire, rest_codec
from server.protocol.grpc import pb2

EXAMPLES = int(os.environ.get("NNSERVE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=2000, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BYTES", "BF16", "FP8", ""]
dims = st.one_of(st.integers(0, 4), st.integers(0, 2**64), st.sampled_from([2**28, 2**31, 2**62, 2**63 - 1, 2**63]))
shapes = st.lists(dims, max_size=6) | st.just([1] * 100)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                         st.text(max_size=8), st.sampled_from([10**400, -(10**400)]))
json_values = st.recursive(json_scalars, lambda kids: st.lists(kids, max_size=5)
                           | st.dictionaries(st.text(max_size=5), kids, max_size=4), max_leaves=30)


def checked(req: InferRequest) -> None:
    """A decoded request is whole: every tensor's data has its shape's element count."""
    for t in req.inputs:
        assert t.data.size == math.prod(t.shape), (t.name, t.shape, t.data.shape)
        assert list(t.data.shape) == list(t.shape)


@st.composite
def rest_inputs(draw: st.DrawFn) -> tuple[dict, bytes]:
    """An input entry (sometimes wrong in any field), and the binary bytes it may claim."""
    item: dict = {"name": draw(st.sampled_from(["in0", "in1", "x" * 2000, ""]) | st.text(max_size=4)),
                  "datatype": draw(st.sampled_from(DATATYPES)), "shape": draw(shapes)}
    tail = b""
    if draw(st.booleans()):
        tail = draw(st.binary(max_size=64))
        item["parameters"] = {"binary_data_size": draw(st.sampled_from([len(tail), 0, -1, 2**40, "4"]))}
    else:
        item["data"] = draw(json_values | st.lists(st.integers(-300, 300) | st.floats(allow_nan=False)
                                                   | st.text(max_size=3), max_size=16))
    for key in draw(st.sets(st.sampled_from(["name", "datatype", "shape"]), max_size=1)):
        item[key] = draw(json_values)
    return item, tail


@st.composite
def rest_bodies(draw: st.DrawFn) -> tuple[bytes, int | None]:
    entries = draw(st.lists(rest_inputs(), max_size=3))
    doc = {"inputs": [e for e, _ in entries], "id": draw(st.text(max_size=5) | st.integers())}
    if draw(st.booleans()):
        doc["outputs"] = draw(st.lists(st.fixed_dictionaries({"name": st.text(max_size=4)}), max_size=3)
                              | json_values)
    if draw(st.booleans()):
        doc["parameters"] = draw(json_values)
    head = json.dumps(doc).encode()
    tail = b"".join(t for _, t in entries)
    if not tail and draw(st.booleans()):
        return head, None
    length = draw(st.sampled_from([len(head), len(head) + 1, len(head) - 1, 0]))
    return head + tail + draw(st.binary(max_size=4)), length


@FUZZ
@given(body=rest_bodies(), yielding=st.booleans())
def test_rest_decoder_on_structured_bodies(body: tuple[bytes, int | None], yielding: bool) -> None:
    content, header_length = body
    try:
        req = rest_codec.decode_request("m", "", content, header_length, yielding=yielding)
    except ServerError:
        return
    checked(req)


@FUZZ
@given(content=st.binary(max_size=512), header_length=st.none() | st.integers(-2, 600))
def test_rest_decoder_on_any_bytes(content: bytes, header_length: int | None) -> None:
    try:
        checked(rest_codec.decode_request("m", "", content, header_length))
    except ServerError:
        pass


@st.composite
def grpc_requests(draw: st.DrawFn) -> pb2.ModelInferRequest:
    req = pb2.ModelInferRequest(model_name=draw(st.text(max_size=6)), id=draw(st.text(max_size=6)))
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        t = req.inputs.add(name=draw(st.text(max_size=4)), datatype=draw(st.sampled_from(DATATYPES)),
                           shape=draw(st.lists(st.integers(-1, 4) | st.sampled_from([2**28, 2**62, 2**63 - 1]),
                                               max_size=5)))
        if raw:
            payload = draw(st.binary(max_size=64))
            if t.datatype == "BYTES" and draw(st.booleans()):
                payload = struct.pack("<I", draw(st.integers(0, 2**32 - 1))) + payload
            req.raw_input_contents.append(payload)
        else:
            kind = draw(st.sampled_from(["fp32_contents", "int_contents", "int64_contents", "bytes_contents",
                                         "bool_contents", "uint64_contents"]))
            values = {"fp32_contents": st.floats(width=32, allow_nan=False),
                      "int_contents": st.integers(-(2**31), 2**31 - 1),
                      "int64_contents": st.integers(-(2**63), 2**63 - 1),
                      "bytes_contents": st.binary(max_size=4), "bool_contents": st.booleans(),
                      "uint64_contents": st.integers(0, 2**64 - 1)}[kind]
            getattr(t.contents, kind).extend(draw(st.lists(values, max_size=10)))
    if raw and draw(st.booleans()):
        req.raw_input_contents.append(b"extra")
    for name in draw(st.lists(st.text(max_size=3), max_size=2)):
        req.outputs.add(name=name)
    if draw(st.booleans()):
        req.parameters["timeout"].string_param = draw(st.text(max_size=3))
    return req


def decode_both_ways(data: bytes) -> InferRequest | None:
    """The protobuf path and the scanning path (grpc_wire, taken by large messages) must agree."""
    outcomes = []
    for parse in (pb2.ModelInferRequest.FromString, _scanned):
        try:
            req = grpc_codec.decode_request(parse(data))
        except (ServerError, DecodeError) as exc:
            outcomes.append(type(exc).__name__ if isinstance(exc, ServerError) else "DecodeError")
            continue
        checked(req)
        outcomes.append([(t.name, t.datatype, t.shape,
                          t.data.reshape(-1).tolist() if t.datatype == "BYTES" else t.data.tobytes())
                         for t in req.inputs])
    # protobuf may refuse invalid UTF-8 the scanner passes on to it: both refuse, maybe at another step
    assert outcomes[0] == outcomes[1] or all(isinstance(o, str) for o in outcomes), outcomes
    return None


def _scanned(data: bytes) -> grpc_wire.InferMessage:
    raw, rest = grpc_wire.split_fields(data, grpc_wire.RAW_INPUT_FIELD)
    return grpc_wire.InferMessage(pb2.ModelInferRequest.FromString(b"".join(rest)), raw)


@FUZZ
@given(req=grpc_requests())
def test_grpc_decoders_on_structured_messages(req: pb2.ModelInferRequest) -> None:
    decode_both_ways(req.SerializeToString())


@FUZZ
@given(req=grpc_requests(), cut=st.integers(0, 200), junk=st.binary(max_size=16))
def test_grpc_decoders_on_damaged_messages(req: pb2.ModelInferRequest, cut: int, junk: bytes) -> None:
    data = req.SerializeToString()
    decode_both_ways(data[: max(len(data) - cut, 0)] + junk)


@FUZZ
@given(data=st.binary(max_size=512))
def test_grpc_decoders_on_any_bytes(data: bytes) -> None:
    decode_both_ways(data)


def test_response_parts_parse_as_the_protobuf_message() -> None:
    """What grpc_wire assembles for a response is what protobuf would have serialized (fields in another order)."""
    out = np.arange(6, dtype=np.float32).reshape(2, 3)
    msg = pb2.ModelInferResponse(model_name="m", model_version="1", id="r")
    msg.outputs.add(name="y", datatype="FP32", shape=[2, 3])
    joined = grpc_wire.serialize_response(grpc_wire.response_parts(msg, [out.reshape(-1).view(np.uint8)]))
    back = pb2.ModelInferResponse.FromString(joined)
    assert back.model_name == "m" and list(back.outputs[0].shape) == [2, 3]
    np.testing.assert_array_equal(np.frombuffer(back.raw_output_contents[0], np.float32).reshape(2, 3), out)
    stream = pb2.ModelStreamInferResponse.FromString(
        grpc_wire.serialize_stream_response(grpc_wire.response_parts(msg, [out.tobytes()])))
    assert stream.infer_response.raw_output_contents[0] == out.tobytes() and not stream.error_message


@st.composite
def group_fields(draw: st.DrawFn) -> bytes:
    """A group (wire types 3 and 4) on any field number, known ones too, holding fields and groups; sometimes left
    open or closed by another field's end tag."""
    def tag(field: int, wire_type: int) -> bytes:
        return grpc_wire._encode_varint(field << 3 | wire_type)

    field = draw(st.integers(1, 20))
    body = b""
    for _ in range(draw(st.integers(0, 3))):
        inner = draw(st.integers(1, 20))
        body += draw(st.sampled_from([tag(inner, 0) + b"\x05", tag(inner, 2) + b"\x02ab", tag(inner, 5) + bytes(4),
                                      tag(inner, 3) + tag(inner, 4)]))
    end = draw(st.sampled_from([tag(field, 4), tag(field, 4), tag(field + 1, 4), b""]))
    return tag(field, 3) + body + end


@FUZZ
@given(req=grpc_requests(), group=group_fields(), first=st.booleans())
def test_grpc_decoders_agree_on_group_fields(req: pb2.ModelInferRequest, group: bytes, first: bool) -> None:
    data = req.SerializeToString()
    decode_both_ways(group + data if first else data + group)


NUMERIC = {"BOOL": ({bool}, None), "INT8": ({int}, np.int8), "INT16": ({int}, np.int16), "INT32": ({int}, np.int32),
           "INT64": ({int}, np.int64), "UINT8": ({int}, np.uint8), "UINT16": ({int}, np.uint16),
           "UINT32": ({int}, np.uint32), "UINT64": ({int}, np.uint64), "FP32": ({int, float}, np.float32),
           "FP64": ({int, float}, np.float64)}  # FP16 and BF16: binary data only (Triton refuses them in JSON)


def _expected_value(value: object, datatype: str) -> object | None:
    """What `value` must decode to as `datatype` (an independent reference: Python's own numbers), or None when
    the decoder must refuse it."""
    kinds, dtype = NUMERIC[datatype]
    if type(value) not in kinds:
        return None
    if dtype is None:
        return value
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return value if info.min <= value <= info.max else None
    try:
        as_float = float(value)
    except OverflowError:
        return None
    with np.errstate(over="ignore"):  # the value rounded to the dtype: infinite when past its largest
        rounded = float(np.float64(as_float).astype(dtype))
    return rounded if math.isfinite(rounded) else None


@FUZZ
@given(datatype=st.sampled_from(sorted(NUMERIC)), yielding=st.booleans(),
       values=st.lists(st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.text(max_size=4),
                                 st.floats(allow_nan=False, allow_infinity=False), st.floats(-1e6, 1e6),
                                 st.integers(-300, 70000), st.dictionaries(st.text(max_size=2), st.none(), max_size=1),
                                 st.sampled_from([65504.0, 65520.0, 3.4028234e38, 3.5e38, 1e308, 10**400, 2**63,
                                                  2**64 - 1, 2**64, -(2**63) - 1, 2.0, -0.0])),
                       min_size=1, max_size=12))
def test_rest_json_numbers_are_exact_or_refused(datatype: str, yielding: bool, values: list) -> None:
    """JSON `data` decodes to exactly its values when each is of a JSON type the datatype takes and fits it, and is
    refused (naming an offending element) otherwise: never coerced, wrapped or made infinite."""
    body = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [len(values)], "data": values}]})
    expected = [_expected_value(v, datatype) for v in values]
    try:
        req = rest_codec.decode_request("m", "", body.encode(), None, yielding=yielding)
    except ServerError as exc:
        kinds = NUMERIC[datatype][0]  # the first value of a wrong JSON type, else the first out of range
        bad = next((i for i, v in enumerate(values) if type(v) not in kinds),
                   next((i for i, e in enumerate(expected) if e is None), None))
        assert bad is not None, (values, exc)
        assert f"element {bad} is" in str(exc), (values, expected, exc)
        return
    assert None not in expected, (values, req.inputs[0].data)
    assert req.inputs[0].data.tolist() == expected
