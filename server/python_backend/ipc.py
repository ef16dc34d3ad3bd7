"""Frames between the server and a Python-backend worker process, over a Unix stream socket.

A frame is a fixed prefix (header length, body length), a JSON header, and a body holding the raw bytes of the
tensors the header lists. Every length is checked against a limit before anything is allocated for it, and every
tensor against the bytes actually there, on both sides: a worker cannot make the server allocate or read past what
it sent, and a model that produces a tensor over the limit gets an error, not a server that runs out of memory.

Tensors are numpy arrays of fixed-size types, or object arrays of bytes (Triton's BYTES), which travel as one
uint32 length per element followed by the elements' bytes. This module imports numpy and the standard library
only: the worker imports it.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

PREFIX = struct.Struct("<IQ")  # header bytes, body bytes
MAX_HEADER_BYTES = 16 * 2**20  # request ids, parameters, tensor descriptions: never near this
MAX_BODY_BYTES = 2**31 - 1  # as gRPC's largest message: one frame carries at most one request's tensors
# The numpy types a tensor may have on this link (Triton's datatypes but BF16, which numpy lacks); "O" is BYTES.
DTYPES = frozenset({"?", "u1", "u2", "u4", "u8", "i1", "i2", "i4", "i8", "f2", "f4", "f8", "O"})
_LENGTH = struct.Struct("<I")

Header = dict[str, Any]
Tensor = tuple[dict[str, Any], np.ndarray]  # (description with at least "name", array)


class IpcError(Exception):
    """A frame that breaks the format or a limit; the link is unusable after it."""


def dtype_code(dtype: np.dtype) -> str:
    """The link's name of a numpy dtype ("i4", "O"), or IpcError for a type it does not carry."""
    code = "O" if dtype.kind in "OSU" else ("?" if dtype.kind == "b" else f"{dtype.kind}{dtype.itemsize}")
    if code not in DTYPES:
        raise IpcError(f"numpy dtype {dtype} has no Triton datatype")
    return code


def as_sendable(array: np.ndarray) -> np.ndarray:
    """`array` as the link carries it: little-endian and contiguous, strings and bytes as an object array of
    bytes (str elements UTF-8 encoded; other objects as their str, as Triton's serialize_byte_tensor does)."""
    array = np.asarray(array)
    if array.dtype.kind in "OSU":
        flat = [_as_bytes(v) for v in array.reshape(-1)]
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(array.shape)
    dtype_code(array.dtype)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, np.bytes_ | bytearray | memoryview):
        return bytes(value)
    return str(value).encode("utf-8")


def _encode(array: np.ndarray) -> list[bytes | memoryview]:
    if array.dtype == object:
        parts: list[bytes | memoryview] = []
        for item in array.reshape(-1):
            parts += [_LENGTH.pack(len(item)), item]
        return parts
    return [memoryview(array).cast("B")] if array.size else []


def encode_frame(header: Header, tensors: Iterable[Tensor] = ()) -> list[bytes | memoryview]:
    """The pieces of one frame, to be written in order; IpcError when it would break a limit."""
    descriptions, chunks, body = [], [], 0
    for description, array in tensors:
        array = as_sendable(array)
        parts = _encode(array)
        size = sum(len(p) for p in parts)
        descriptions.append({**description, "dtype": dtype_code(array.dtype), "shape": list(array.shape),
                             "nbytes": size})
        chunks += parts
        body += size
    head = json.dumps({**header, "tensors": descriptions}, separators=(",", ":")).encode()
    if len(head) > MAX_HEADER_BYTES:
        raise IpcError(f"a message header of {len(head)} bytes exceeds the limit of {MAX_HEADER_BYTES}")
    if body > MAX_BODY_BYTES:
        raise IpcError(f"tensors of {body} bytes exceed the Python backend's limit of {MAX_BODY_BYTES} bytes per "
                       "message")
    return [PREFIX.pack(len(head), body), head, *chunks]


class Link:
    """One end of the socket: whole frames out (from any thread, one at a time), whole frames in (one reader)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._send_lock = threading.Lock()

    def send(self, header: Header, tensors: Iterable[Tensor] = ()) -> None:
        self.send_pieces(encode_frame(header, tensors))

    def send_pieces(self, pieces: list[bytes | memoryview]) -> None:
        """Writes one frame's pieces (encode_frame's)."""
        with self._send_lock:
            for piece in pieces:
                self.sock.sendall(piece)

    def receive(self) -> tuple[Header, list[Tensor]] | None:
        """The next frame, or None when the other end closed the socket between frames."""
        prefix = self._read(PREFIX.size, allow_eof=True)
        if prefix is None:
            return None
        head_len, body_len = PREFIX.unpack(prefix)
        if head_len > MAX_HEADER_BYTES or body_len > MAX_BODY_BYTES:
            raise IpcError(f"a frame announces {head_len} header and {body_len} body bytes, over the limits "
                           f"({MAX_HEADER_BYTES}, {MAX_BODY_BYTES})")
        head = self._read(head_len)
        body = self._read(body_len) if body_len else bytearray()
        assert head is not None and body is not None
        try:
            header = json.loads(head)
        except ValueError as exc:
            raise IpcError(f"a frame header is not JSON: {exc}") from None
        if not isinstance(header, dict):
            raise IpcError("a frame header is not a JSON object")
        return header, decode_tensors(header.pop("tensors", []), body)

    def _read(self, n: int, allow_eof: bool = False) -> bytearray | None:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                if allow_eof and got == 0:
                    return None
                raise IpcError(f"the link closed in the middle of a frame ({got} of {n} bytes)")
            got += k
        return buf

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def decode_tensors(descriptions: Any, body: bytearray) -> list[Tensor]:
    """The arrays a header describes, each checked against its declared size and the body's end (numeric arrays
    are views of `body`, which the caller then owns)."""
    if not isinstance(descriptions, list):
        raise IpcError("a frame's tensor list is not a list")
    out, pos = [], 0
    for d in descriptions:
        if not isinstance(d, dict) or not {"name", "dtype", "shape", "nbytes"} <= d.keys():
            raise IpcError("a tensor description lacks name, dtype, shape or nbytes")
        shape, nbytes, code = d["shape"], d["nbytes"], d["dtype"]
        if (code not in DTYPES or not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape)
                or not isinstance(nbytes, int) or nbytes < 0 or pos + nbytes > len(body)):
            raise IpcError(f"tensor '{d.get('name')}': a malformed description or past the frame's end")
        out.append((d, _decode(memoryview(body)[pos:pos + nbytes], code, shape, str(d["name"]))))
        pos += nbytes
    if pos != len(body):
        raise IpcError(f"{len(body) - pos} bytes of a frame are claimed by no tensor")
    return out


def _decode(raw: memoryview, code: str, shape: Sequence[int], name: str) -> np.ndarray:
    count = 1
    for s in shape:
        count *= s
    if code != "O":
        dtype = np.dtype(bool if code == "?" else code).newbyteorder("<")
        if len(raw) != count * dtype.itemsize:
            raise IpcError(f"tensor '{name}': {len(raw)} bytes for shape {list(shape)} of {dtype}")
        return np.frombuffer(raw, dtype=dtype).reshape(shape)
    if count * _LENGTH.size > len(raw):  # before allocating: each element holds at least its 4-byte length
        raise IpcError(f"tensor '{name}': {len(raw)} bytes cannot hold {count} BYTES elements")
    out = np.empty(count, dtype=object)
    pos = 0
    for i in range(count):
        if pos + 4 > len(raw):
            raise IpcError(f"tensor '{name}': BYTES data ends after {i} of {count} elements")
        (n,) = _LENGTH.unpack_from(raw, pos)
        if pos + 4 + n > len(raw):
            raise IpcError(f"tensor '{name}': BYTES element {i} runs past the tensor's end")
        out[i] = bytes(raw[pos + 4:pos + 4 + n])
        pos += 4 + n
    if pos != len(raw):
        raise IpcError(f"tensor '{name}': {len(raw) - pos} bytes after its {count} BYTES elements")
    return out.reshape(shape)
