"""ModelInferRequest / ModelInferResponse in protobuf's wire format, for the bulk of a message: its raw tensors.

protobuf copies every bytes field it parses, and again each time Python reads one, and grpc hands the server the
serialized message as one more copy: a large request cost ~3.5x its size. Here the message's top-level fields are
scanned (a handful of tags), the raw_input_contents entries are kept as views into the bytes grpc received, and
only the rest (names, shapes, parameters: small) goes through protobuf. Responses are assembled the same way: the
small part serialized by protobuf, the raw outputs appended as they are, in one join.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from server.protocol.grpc import pb2

# Below this a message is parsed by protobuf whole: its copies cost less than scanning in Python.
SCAN_BYTES = 64 * 1024
RAW_INPUT_FIELD = 7  # ModelInferRequest.raw_input_contents
RAW_OUTPUT_FIELD = 6  # ModelInferResponse.raw_output_contents
STREAM_RESPONSE_FIELD = 2  # ModelStreamInferResponse.infer_response
_LEN = 2  # wire type of length-delimited fields
_START_GROUP, _END_GROUP = 3, 4  # wire types of a group's tags (proto2 groups)
# The most top-level fields a scanned message may have (each input, output, raw tensor and parameter is one). Each
# costs a turn of the scan on the event loop and a Python object (a view, a tensor): without a bound, 40 MiB of
# empty raw_input_contents entries (2 bytes each) held the loop for minutes and took 7 GiB. No real request
# names this many tensors.
MAX_FIELDS = 65536


@dataclass(slots=True)
class InferMessage:
    """A ModelInferRequest whose raw_input_contents (`raw`) are views into the received bytes; `message` has the
    rest. What the ModelInfer and ModelStreamInfer handlers receive."""

    message: Any
    raw: list[memoryview]

    @property
    def id(self) -> str:
        return self.message.id


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise DecodeError("truncated varint")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise DecodeError("varint longer than 10 bytes")


def _skip(data: bytes, pos: int, tag: int) -> int:
    """The position after the value of the field whose tag was read (may lie past the end: the caller checks)."""
    wire_type = tag & 7
    if wire_type == 0:
        return _varint(data, pos)[1]
    if wire_type == 1:
        return pos + 8
    if wire_type == _LEN:
        length, pos = _varint(data, pos)
        return pos + length
    if wire_type == 5:
        return pos + 4
    if wire_type == _START_GROUP:
        return _skip_group(data, pos, tag >> 3)
    raise DecodeError(f"wire type {wire_type} is not used by this message")  # 4 without its start, 6, 7


def _skip_group(data: bytes, pos: int, field: int) -> int:
    """The position after the end-group tag that closes the group of `field` started before `pos`. The message has
    no groups, but protobuf keeps a group of a field it does not know as unknown data and parses the message, as it
    does a message below SCAN_BYTES: so the scan steps over the group (nested ones too) and leaves the rest to it."""
    open_groups = [field]
    while open_groups:
        if pos >= len(data):
            raise DecodeError("truncated group")
        tag, pos = _varint(data, pos)
        if tag >> 3 == 0:
            raise DecodeError("field number 0")
        if tag & 7 == _END_GROUP:
            if tag >> 3 != open_groups.pop():
                raise DecodeError("end-group tag does not match its start-group tag")
        elif tag & 7 == _START_GROUP:
            open_groups.append(tag >> 3)
        else:
            pos = _skip(data, pos, tag)
    if pos > len(data):
        raise DecodeError("truncated message")
    return pos


def split_fields(data: bytes, field: int) -> tuple[list[memoryview], list[memoryview]]:
    """(views of every length-delimited top-level `field`, views of the runs of all other fields in order)."""
    view = memoryview(data)
    found: list[memoryview] = []
    rest: list[memoryview] = []
    pos = run = fields = 0
    end = len(data)
    while pos < end:
        fields += 1
        if fields > MAX_FIELDS:
            raise DecodeError(f"more than {MAX_FIELDS} top-level fields (inputs, outputs, raw tensors, parameters) "
                              "in one message")
        start = pos
        tag, pos = _varint(data, pos)
        if tag >> 3 == 0:
            raise DecodeError("field number 0")
        if tag == (field << 3 | _LEN):
            length, pos = _varint(data, pos)
            if pos + length > end:
                raise DecodeError("truncated message")
            rest.append(view[run:start])
            found.append(view[pos : pos + length])
            pos = run = pos + length
            continue
        pos = _skip(data, pos, tag)
        if pos > end:
            raise DecodeError("truncated message")
    rest.append(view[run:end])
    return found, rest


def parse_infer_request(data: bytes) -> Any:
    """grpc's request deserializer for ModelInfer and ModelStreamInfer: small messages as protobuf parses them, large
    ones as an InferMessage holding views of the raw tensors (no copy of them)."""
    if len(data) < SCAN_BYTES:
        return pb2.ModelInferRequest.FromString(data)
    raw, rest = split_fields(data, RAW_INPUT_FIELD)
    message = pb2.ModelInferRequest.FromString(b"".join(rest))
    return InferMessage(message, raw)


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_header(field: int, length: int) -> bytes:
    return _encode_varint(field << 3 | _LEN) + _encode_varint(length)


def response_parts(message: Any, raw_outputs: list[Any]) -> list[Any]:
    """A ModelInferResponse as buffers to join: `message` (without raw outputs) serialized, then each raw output
    (a bytes-like object) behind its field header; fields may come in any order on the wire."""
    parts: list[Any] = [message.SerializeToString()]
    for raw in raw_outputs:
        parts += (field_header(RAW_OUTPUT_FIELD, memoryview(raw).nbytes), raw)
    return parts


def serialize_response(parts: Any) -> bytes:
    """grpc's response serializer for ModelInfer: the handler answers with the parts of response_parts (or a
    ModelInferResponse)."""
    return b"".join(parts) if isinstance(parts, list) else parts.SerializeToString()


def serialize_stream_response(item: Any) -> bytes:
    """ModelStreamInfer's serializer: a list of a response's parts (wrapped as infer_response), or a
    ModelStreamInferResponse message (errors)."""
    if not isinstance(item, list):
        return item.SerializeToString()
    size = sum(memoryview(p).nbytes for p in item)
    return b"".join([field_header(STREAM_RESPONSE_FIELD, size), *item])
