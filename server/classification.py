"""Triton's classification extension: an output requested with the parameter `classification: k` comes back as the
k highest-scoring classes, each a BYTES string "score:index" or "score:index:label" (labels from the output's
label_filename in config.pbtxt), instead of the raw scores.

As in Triton (server classification.cc, http_server.cc / grpc infer_handler.h): a batching model gets k classes per
batch row (shape [batch, k]), any other model one list over the whole tensor (shape [k]); k is capped at the
number of elements per row; scores print as C++'s std::to_string (6 decimals for floats, integers as they are);
labels are the label file's lines, and a class past the last line has none.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from server.errors import InvalidArgumentError, ModelLoadError
from server.repository_files import read_regular
from server.request_limits import quoted
from server.security import inside

CLASSIFICATION = "classification"
# Triton's bound on the scores ranked per row: sorting more would be a client-chosen CPU cost.
MAX_ELEMENTS = 1_000_000
# A label file is one line per class; a bigger file is not one.
LABELS_MAX_BYTES = 64 * 2**20
_INTEGER_TYPES = ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64")
_FLOAT_TYPES = ("FP32", "FP64")


def class_count(params: dict[str, Any]) -> int:
    """The `classification` parameter of a requested output: 0 when absent (raw scores)."""
    value = params.get(CLASSIFICATION)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"invalid value for '{CLASSIFICATION}' parameter, expected an integer >= 0, got "
                                   f"{quoted(repr(value))}")
    return value


def top_classes(scores: np.ndarray, datatype: str, count: int, batching: bool, labels: list[str]) -> np.ndarray:
    """The `count` best classes of `scores` as an object array of bytes: [batch, k] for a batching model, else [k]."""
    if datatype not in _INTEGER_TYPES + _FLOAT_TYPES:  # Triton's words
        raise InvalidArgumentError(f"class result not available for output due to unsupported type '{datatype}'")
    batched = batching and scores.ndim > 0
    rows = scores.reshape(scores.shape[0], -1) if batched else scores.reshape(1, -1)
    per_row = math.prod(scores.shape[1:]) if batched else scores.size
    if per_row > MAX_ELEMENTS:
        raise InvalidArgumentError("classification output tensor too large")
    k = min(count, per_row)
    text = "%f" if datatype in _FLOAT_TYPES else "%d"
    out = np.empty((rows.shape[0], k), dtype=np.object_)
    for r, row in enumerate(rows):
        for j, index in enumerate(_best(row, k)):
            entry = f"{text % row[index]}:{index}"
            label = labels[index] if index < len(labels) else ""
            out[r, j] = (f"{entry}:{label}" if label else entry).encode()
    return out if batched else out.reshape(k)


def _best(row: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, largest first; ties in index order (a stable sort, where Triton's is not
    specified)."""
    backwards = np.argsort(row[::-1], kind="stable")[::-1]
    return (row.size - 1 - backwards)[:k]


def read_labels(model_dir: Path, label_filename: str, output: str, model: str) -> list[str]:
    """The label file of an output: relative to the model directory and inside it (Triton's rule), one label per
    line (a last line without a newline counts; a Windows line end stays part of its label, as in Triton)."""
    path = model_dir / label_filename
    if Path(label_filename).is_absolute() or not inside(model_dir, path):
        raise ModelLoadError(f"model '{model}': label file path '{label_filename}' for output '{output}' is outside "
                             "the model directory")
    raw = read_regular(path, LABELS_MAX_BYTES, f"model '{model}': label file '{label_filename}' of output "
                                               f"'{output}'")
    text = raw.decode("utf-8", "replace")
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") else lines
