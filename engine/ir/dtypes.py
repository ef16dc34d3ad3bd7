"""Element types. The IR stores numpy dtypes; these maps translate the names formats and protocols use."""

from __future__ import annotations

import numpy as np

# Names as the KServe v2 protocol spells them (also what Model.inputs reports).
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
_BY_DTYPE = {v: k for k, v in DTYPES.items()}


def to_dtype(x: str | np.dtype | type) -> np.dtype:
    """Accepts a KServe name ('FP32'), a numpy name ('float32') or a dtype."""
    if isinstance(x, str) and x.upper() in DTYPES:
        return DTYPES[x.upper()]
    return np.dtype(x)


def kserve_name(dtype: np.dtype) -> str:
    """The KServe v2 datatype name of a numpy dtype."""
    return _BY_DTYPE[np.dtype(dtype)]
