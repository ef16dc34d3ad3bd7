"""KServe wire datatypes <-> numpy dtypes <-> config TYPE_* enums, and the BYTES wire encoding."""

from __future__ import annotations

import functools
import math
import struct

import numpy as np

from engine.ir.dtypes import DTYPES
from server.errors import InvalidArgumentError

# The engine's KServe name table, plus BYTES, which only the wire knows (numpy object arrays of bytes).
_WIRE_TO_NUMPY = {**DTYPES, "BYTES": np.dtype(np.object_)}
_NUMPY_TO_WIRE = {v: k for k, v in _WIRE_TO_NUMPY.items()}

# Config enum numbers (proto/model_config.proto DataType) in wire-name order; TYPE_STRING is BYTES on the wire.
_CONFIG_TO_WIRE = {1: "BOOL", 2: "UINT8", 3: "UINT16", 4: "UINT32", 5: "UINT64", 6: "INT8", 7: "INT16", 8: "INT32",
                   9: "INT64", 10: "FP16", 11: "FP32", 12: "FP64", 13: "BYTES", 14: "BF16"}
_WIRE_TO_CONFIG = {v: k for k, v in _CONFIG_TO_WIRE.items()}


def wire_to_numpy(datatype: str) -> np.dtype:
    try:
        return _WIRE_TO_NUMPY[datatype]
    except KeyError:
        raise InvalidArgumentError(f"unsupported datatype '{datatype}'") from None


def numpy_to_wire(dtype: np.dtype) -> str:
    dtype = np.dtype(dtype)
    if dtype.kind in "SUO":
        return "BYTES"
    try:
        return _NUMPY_TO_WIRE[dtype]
    except KeyError:
        raise InvalidArgumentError(f"numpy dtype {dtype} has no KServe datatype") from None


def config_type_to_wire(value: int) -> str:
    return _CONFIG_TO_WIRE.get(value, "INVALID")


def wire_to_config_type(datatype: str) -> int:
    return _WIRE_TO_CONFIG.get(datatype, 0)


def element_size(datatype: str) -> int:
    """Bytes per element of a fixed-size datatype (BYTES has none)."""
    return wire_to_numpy(datatype).itemsize


def decode_bytes_tensor(raw: bytes | memoryview, count: int, name: str) -> np.ndarray:
    """BYTES wire layout: per element a 4-byte little-endian length, then the bytes."""
    out = np.empty(count, dtype=np.object_)
    view, pos = memoryview(raw), 0
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
    count = math.prod(shape)  # exact: np.prod would wrap around on huge dims
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
