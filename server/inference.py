"""Transport-agnostic inference request and response, numpy-backed: what the data plane takes and answers. The REST
and gRPC codecs (server/protocol/) convert to and from these."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from server.backend import SequenceFlags
from server.errors import InvalidArgumentError, ServerError
from server.request_limits import quoted


@dataclass(frozen=True)
class ShmRef:
    """A tensor in a registered shared-memory region (Triton's shared-memory extension): the window
    [offset, offset + byte_size) of region `region`."""

    region: str
    offset: int
    byte_size: int


SHM_REGION, SHM_OFFSET, SHM_BYTE_SIZE = "shared_memory_region", "shared_memory_offset", "shared_memory_byte_size"


def shm_ref(params: dict[str, Any], tensor: str) -> ShmRef | None:
    """The shared-memory window a tensor's parameters name, or None; Triton's rules: the region is a string, the
    byte size is required with it, the offset optional (0), neither without a region."""
    region = params.get(SHM_REGION)
    if region is None:
        for key in (SHM_OFFSET, SHM_BYTE_SIZE):
            if key in params:
                raise InvalidArgumentError(f"'{key}' can not be specified without '{SHM_REGION}' parameter for "
                                           f"tensor '{tensor}'")
        return None
    if not isinstance(region, str):
        raise InvalidArgumentError(f"invalid value type for '{SHM_REGION}' parameter for tensor '{tensor}', expected "
                                   "a string")
    if SHM_BYTE_SIZE not in params:
        raise InvalidArgumentError(f"'{SHM_BYTE_SIZE}' must be specified along with '{SHM_REGION}' parameter for "
                                   f"tensor '{tensor}'")
    return ShmRef(region, _size_param(params, SHM_OFFSET, tensor), _size_param(params, SHM_BYTE_SIZE, tensor))


def _size_param(params: dict[str, Any], key: str, tensor: str) -> int:
    value = params.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise InvalidArgumentError(f"invalid value for '{key}' parameter for tensor '{tensor}', expected a "
                                   "non-negative integer")
    return value


@dataclass
class InferInput:
    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray | None  # None until a shared-memory input is read (DataPlane.infer)
    shm: ShmRef | None = None


@dataclass
class RequestedOutput:
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferRequest:
    model_name: str
    model_version: str = ""
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    inputs: list[InferInput] = field(default_factory=list)
    outputs: list[RequestedOutput] = field(default_factory=list)
    # The most bytes its shared-memory inputs may hold: the transport's limit on a request's tensors, set by the
    # transport (None: unlimited, as for requests made inside the server)
    max_shm_input_bytes: int | None = None
    # When the front end got the request (time.perf_counter_ns), before decoding it: where its time in the server
    # (the statistics' success and fail durations) starts; 0 for requests made inside the server (they start when
    # the data plane gets them)
    arrival_ns: int = 0
    # The client's W3C trace context (traceparent header or gRPC metadata), read only in OpenTelemetry trace mode
    traceparent: str = ""
    # Called as the request is handed to its model's scheduler (a stream hands its next request on only then, so
    # that a stream's requests reach their model in order); None when nobody waits for that
    on_scheduled: Callable[[], None] | None = None

    @property
    def priority(self) -> int:
        return _int_param(self.parameters, "priority") or 0

    @property
    def timeout_us(self) -> int | None:
        return _int_param(self.parameters, "timeout") or None

    @property
    def sequence(self) -> SequenceFlags | None:
        """The sequence the request belongs to (parameters sequence_id, sequence_start, sequence_end, as the
        clients send them); None without a sequence_id (or with 0 or "": Triton's "no correlation ID")."""
        return sequence_flags(self.parameters)


SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")


def sequence_flags(params: dict[str, Any]) -> SequenceFlags | None:
    value = params.get("sequence_id")
    if value is None or value == 0 or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidArgumentError(f"parameter 'sequence_id' must be an unsigned integer or a string, got "
                                   f"{type(value).__name__}")
    if isinstance(value, int) and not 0 < value < 2**64:
        raise InvalidArgumentError("parameter 'sequence_id' must be an unsigned 64-bit integer")
    return SequenceFlags(value, _bool_param(params, "sequence_start"), _bool_param(params, "sequence_end"))


def _bool_param(params: dict[str, Any], key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"parameter '{key}' must be a boolean, got {type(value).__name__}")
    return value


def _int_param(params: dict[str, Any], key: str) -> int | None:
    """priority and timeout: Triton's fields are uint64 (it reads them with AsUInt over REST, int64 >= 0 or uint64
    over gRPC), so anything but an integer in [0, 2**64) is refused, in Triton's words, rather than clamped or
    wrapped."""
    value = params.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        shown = quoted(json.dumps(value) if isinstance(value, bool | float | str) else repr(value))
        raise InvalidArgumentError(f"Unable to parse '{key}': expected an unsigned 64-bit integer, got {shown}")
    return value


@dataclass
class OutputTensor:
    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)
    in_shared_memory: bool = False  # written to the region the request named: the response carries no data


@dataclass
class InferResponse:
    model_name: str
    model_version: str
    id: str
    outputs: list[OutputTensor]
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class StreamResponse:
    """One response of a request on a stream: a decoupled model sends 0..n, the last with `final`; any other model
    one (final). `response` None with `final`: the final flag alone (Triton sends it only to a client that asked
    with triton_enable_empty_final_response)."""

    response: InferResponse | None
    error: ServerError | None = None
    final: bool = True
