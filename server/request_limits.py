"""What a request may declare (ranks, dims, element counts, name lengths), checked before anything is sized from it.

A request declares its shape in a few bytes and its data separately: every count is checked here, and against the
bytes that really came, before an array is allocated (a 117-byte request must not make the server allocate 4 GiB).
"""

from __future__ import annotations

import json

from server.errors import InvalidArgumentError

# numpy's own limit (NPY_MAXDIMS); no model has that many dims, and a longer shape is only work for the server.
MAX_DIMS = 64
# KServe and Triton carry dims as int64.
MAX_DIM = 2**63 - 1
# The most elements a tensor may have: its bytes, at up to 16 per element, must be countable in an int64 (numpy).
MAX_ELEMENTS = 2**59
# Model names are directory names in the repository (NAME_MAX); a longer one cannot exist, and echoing it into an
# error (gRPC trailers have a size limit of their own) would fail the answer itself.
MAX_NAME_BYTES = 255
# Tensor names, versions and request ids are echoed in errors and responses: long enough for any real one.
MAX_LABEL_BYTES = 1024
# What an error message quotes of a name that is too long to quote whole.
QUOTED_CHARS = 64


def element_count(shape: list[int], name: str) -> int:
    """The number of elements of `shape` (a list of ints); 400 for a rank or a size no tensor can have."""
    if len(shape) > MAX_DIMS:
        raise InvalidArgumentError(f"input '{name}': shape has {len(shape)} dims; at most {MAX_DIMS} are supported")
    count = span = 1
    for d in shape:
        if d < 0 or d > MAX_DIM:
            raise InvalidArgumentError(f"input '{name}': dim {d} of shape {shape} is outside 0..2**63-1")
        count *= d
        span *= d or 1
    # numpy sizes an array from its non-zero dims even when one is 0: [0, 2**62] cannot be made either
    if span > MAX_ELEMENTS:
        raise InvalidArgumentError(f"input '{name}': shape {shape} needs {span} elements (0 dims aside), more "
                                   "than 2**59")
    return count


def quoted(text: str, limit: int = QUOTED_CHARS) -> str:
    """`text` for an error message: whole if short, else its start and its length."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def check_model_name(name: str) -> None:
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise InvalidArgumentError(f"model name '{quoted(name)}' is longer than {MAX_NAME_BYTES} bytes")


def check_label(value: str, what: str) -> None:
    """Tensor names, versions, ids: bounded, since errors and responses echo them."""
    if len(value) > MAX_LABEL_BYTES:
        raise InvalidArgumentError(f"{what} '{quoted(value)}' is longer than {MAX_LABEL_BYTES} characters")


def check_version(version: str) -> None:
    """Triton's rule and message: a version is empty (the latest) or a non-negative integer."""
    check_label(version, "model version")
    if version and not (version.isascii() and version.isdigit()):
        raise InvalidArgumentError(f"failed to get model version from specified version string '{version}' "
                                   "(details: stol), version should be an integral value > 0")


def check_json(text: str, what: str) -> None:
    """400 for JSON nested past what the parsers behind it (json, protobuf's json_format) can take without a
    RecursionError; their own errors (syntax, fields) keep their messages."""
    try:
        json.loads(text)
    except RecursionError:
        raise InvalidArgumentError(f"{what}: JSON nested too deeply") from None
    except ValueError:
        pass
