"""KServe wire datatypes <-> numpy dtypes <-> config TYPE_* enums."""

from __future__ import annotations

import numpy as np

from engine import DTYPES
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
