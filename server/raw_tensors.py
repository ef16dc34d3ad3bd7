"""Tensors as the bytes both protocols carry: raw little-endian row-major data (gRPC raw_input_contents, the HTTP
binary tensor extension) and the BYTES layout (each element a 4-byte little-endian length, then its bytes)."""

from __future__ import annotations

import functools
import struct

import numpy as np

from server.datatypes import wire_to_numpy
from server.errors import InvalidArgumentError
from server.request_limits import element_count


def decode_bytes_tensor(raw: bytes | memoryview, count: int, name: str) -> np.ndarray:
    """BYTES wire layout: per element a 4-byte little-endian length, then the bytes."""
    view, pos = memoryview(raw), 0
    if count > len(view) // 4:  # before the array: each element takes at least its 4-byte length
        raise InvalidArgumentError(f"input '{name}': BYTES data ends after {len(view)} bytes, too short for {count} "
                                   "elements (each needs at least 4)")
    out = np.empty(count, dtype=np.object_)
    for i in range(count):
        if pos + 4 > len(view):
            raise InvalidArgumentError(f"input '{name}': BYTES data ends after {i} of {count} elements")
        (n,) = struct.unpack_from("<I", view, pos)
        if pos + 4 + n > len(view):
            raise InvalidArgumentError(f"input '{name}': BYTES element {i} claims {n} bytes past the end of the data")
        out[i] = bytes(view[pos + 4 : pos + 4 + n])
        pos += 4 + n
    if pos != len(view):
        raise InvalidArgumentError(f"input '{name}': {len(view) - pos} trailing bytes after {count} BYTES elements")
    return out


def encode_bytes_tensor(arr: np.ndarray) -> bytes:
    parts = []
    for item in arr.reshape(-1):
        b = item if isinstance(item, bytes) else str(item).encode()
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)
    return b"".join(parts)


def tensor_from_raw(raw: bytes | memoryview, datatype: str, shape: list[int], name: str) -> np.ndarray:
    """Raw little-endian row-major bytes -> array; the size must match shape x element size exactly."""
    count = element_count(shape, name)  # exact, and bounded: np.prod would wrap around on huge dims
    if datatype == "BYTES":
        return decode_bytes_tensor(raw, count, name).reshape(shape)
    dtype = _little_endian(datatype)
    if len(raw) != count * dtype.itemsize:
        raise InvalidArgumentError(f"input '{name}': got {len(raw)} bytes of data, but shape {shape} of {datatype} "
                                   f"needs {count * dtype.itemsize}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


@functools.cache
def _little_endian(datatype: str) -> np.dtype:
    return wire_to_numpy(datatype).newbyteorder("<")


def tensor_to_raw(arr: np.ndarray) -> bytes:
    if arr.dtype.kind in "SUO":
        return encode_bytes_tensor(arr)
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def tensor_raw_view(arr: np.ndarray) -> bytes | np.ndarray:
    """What tensor_to_raw gives, as a bytes-like object that shares `arr`'s memory when it can (C-contiguous,
    little-endian): a flat uint8 array."""
    if arr.dtype.kind in "SUO":
        return encode_bytes_tensor(arr)
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).reshape(-1).view(np.uint8)
