"""`triton_python_backend_utils`, as a model.py written for Triton's Python backend imports it:

    import triton_python_backend_utils as pb_utils

The worker process (stub.py) registers this module under that name before it imports the model. It holds the
classes a model sees (Tensor, InferenceRequest, InferenceResponse, InferenceResponseSender, TritonError,
TritonModelException, ModelConfig for auto_complete_config, Logger) and Triton's helper functions. BLS calls
(InferenceRequest.exec / async_exec), decoupled responses and log lines go through the worker's link to the server,
set in `_worker` by the stub.

numpy and the standard library only: this module runs in the worker.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2

# Triton's DataType enum (model_config.proto) <-> numpy; TYPE_STRING (13) is BYTES, numpy objects.
_TYPE_NUMBERS: dict[int, Any] = {1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64, 6: np.int8,
                                 7: np.int16, 8: np.int32, 9: np.int64, 10: np.float16, 11: np.float32,
                                 12: np.float64, 13: np.object_}
_TYPE_NAMES = {"TYPE_BOOL": 1, "TYPE_UINT8": 2, "TYPE_UINT16": 3, "TYPE_UINT32": 4, "TYPE_UINT64": 5,
               "TYPE_INT8": 6, "TYPE_INT16": 7, "TYPE_INT32": 8, "TYPE_INT64": 9, "TYPE_FP16": 10, "TYPE_FP32": 11,
               "TYPE_FP64": 12, "TYPE_STRING": 13}
TRITON_STRING_TO_NUMPY = {name: (bool if n == 1 else _TYPE_NUMBERS[n]) for name, n in _TYPE_NAMES.items()}


class _Worker(Protocol):
    """What this module needs of the worker process it runs in (stub.py's Worker)."""

    decoupled: bool

    def send_response(self, request: InferenceRequest, response: InferenceResponse | None, final: bool) -> None: ...

    def call_model(self, request: InferenceRequest, decoupled: bool) -> Iterator[InferenceResponse]: ...

    def log(self, level: str, message: str) -> None: ...

    def is_cancelled(self, token: int) -> bool: ...


_worker: _Worker | None = None  # set by stub.py


def _link() -> _Worker:
    if _worker is None:
        raise TritonModelException("triton_python_backend_utils is used outside a Python-backend model process")
    return _worker


# ---- errors ------------------------------------------------------------------------------------------------------
class TritonError:
    """An error to put in an InferenceResponse (or that a BLS response carries)."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = 1):
        self._message, self._code = str(message), int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code})"


class TritonModelException(Exception):
    """Raised by a model (or by this module) to fail a call: initialize, execute, finalize, a BLS exec()."""

    def message(self) -> str:
        return str(self)


# ---- tensors -----------------------------------------------------------------------------------------------------
class Tensor:
    """A named tensor on the CPU, backed by a numpy array (BYTES: an object array of bytes)."""

    def __init__(self, name: str, data: Any, dtype: Any = None):
        array = np.asarray(data) if dtype is None else np.asarray(data, dtype=dtype)
        if array.dtype.kind in "SU":  # fixed-width strings: numpy would drop trailing NULs; keep every byte
            array = np.array([v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.reshape(-1)],
                             dtype=object).reshape(array.shape)
        if numpy_to_triton_type(array.dtype) is None:
            raise TritonModelException(f"tensor '{name}': numpy dtype {array.dtype} has no Triton datatype")
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        return numpy_to_triton_type(self._array.dtype) or 0

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        return Tensor(name, np.from_dlpack(capsule))

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype})"


class PreferredMemory:
    """Where a BLS call's outputs should live: every output here is on the CPU."""

    def __init__(self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0):
        self.preferred_memory_type, self.preferred_device_id = preferred_memory_type, preferred_device_id


# ---- requests and responses --------------------------------------------------------------------------------------
class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None,
                 parameters: dict[str, Any] | str | None = None):
        self._outputs = list(output_tensors or [])
        self._error = error
        self._parameters = _parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


class InferenceResponseSender:
    """Sends a request's responses: any number, the last with TRITONSERVER_RESPONSE_COMPLETE_FINAL (decoupled
    models); exactly one with the final flag (a default-mode model that chooses to send rather than return)."""

    def __init__(self, request: InferenceRequest, decoupled: bool):
        self._request, self._decoupled = request, decoupled
        self._closed = False
        self._sent = 0
        self.collected: InferenceResponse | None = None  # default mode: the one response, returned by execute

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException("Inference Response object must be provided when the response flags is set "
                                       "to zero.")
        if not self._decoupled:
            if response is not None and self._sent > 0:
                raise TritonModelException("Unable to send response. Non-decoupled model cannot send more than one "
                                           "response.")
            if response is None and final and self._sent == 0:
                raise TritonModelException("Unable to send response. Non-decoupled model cannot send complete final "
                                           "before sending a response.")
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        self._closed = final
        self._sent += 1
        if self._decoupled:
            _link().send_response(self._request, response, final)
        elif response is not None:
            self.collected = response

    def is_cancelled(self) -> bool:
        return self._request.is_cancelled()

    @property
    def closed(self) -> bool:
        return self._closed


class InferenceRequest:
    """A request the model received (in execute), or one it builds to call another model (BLS)."""

    def __init__(self, model_name: str, inputs: list[Tensor] | None = None,
                 requested_output_names: list[str] | None = None, request_id: str = "",
                 correlation_id: int | str = 0, model_version: int = -1, flags: int = 0, timeout: int = 0,
                 preferred_memory: PreferredMemory | None = None, trace: Any = None,
                 parameters: dict[str, Any] | str | None = None):
        self._model_name, self._inputs = model_name, list(inputs or [])
        self._outputs = list(requested_output_names or [])
        self._id, self._correlation_id, self._version = str(request_id), correlation_id, int(model_version)
        self._flags, self._timeout = int(flags), int(timeout)
        self._parameters = _parameters_json(parameters)
        self._sender: InferenceResponseSender | None = None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self.token = -1  # the server's handle of a received request; -1 for a BLS request

    # what a received request offers
    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._version

    def requested_output_names(self) -> list[str]:
        return self._outputs

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters

    def is_cancelled(self) -> bool:
        """True once the server cancelled this request: its client went away (an HTTP disconnect, a gRPC cancel or
        deadline) while execute ran, or, decoupled, before the final response or by no longer reading. A request
        this model builds (BLS) is never cancelled."""
        return self.token >= 0 and _link().is_cancelled(self.token)

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            self._sender = InferenceResponseSender(self, _link().decoupled)
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        if flags != TRITONSERVER_REQUEST_RELEASE_ALL:
            raise TritonModelException("request rescheduling needs the sequence batcher's iterative sequences, "
                                       "which nnserve does not have")
        self._release_flags = flags

    # BLS: this request run on another model of the server
    def exec(self, decoupled: bool = False) -> Any:
        responses = _link().call_model(self, decoupled)
        return responses if decoupled else next(responses)

    async def async_exec(self, decoupled: bool = False) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, self.exec, decoupled)


def _parameters_json(parameters: dict[str, Any] | str | None) -> str:
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):
        json.loads(parameters)  # must be JSON
        return parameters
    for key, value in parameters.items():
        if not isinstance(key, str) or not isinstance(value, bool | int | str):
            raise TritonModelException(f"parameter '{key}': keys must be str and values bool, int or str")
    return json.dumps(parameters)


# ---- logging -----------------------------------------------------------------------------------------------------
class Logger:
    """Lines into the server's log, under the model's name."""

    INFO, WARNING, ERROR, VERBOSE = "INFO", "WARNING", "ERROR", "VERBOSE"

    @staticmethod
    def log(message: str, level: str = "INFO") -> None:
        _link().log(level, str(message))

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, Logger.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, Logger.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, Logger.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, Logger.VERBOSE)


# ---- the model repository from a model: not offered --------------------------------------------------------------
def is_model_ready(model_name: str, model_version: str = "") -> bool:
    raise TritonModelException("the model loading API is not available to Python models in nnserve")


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    raise TritonModelException("the model loading API is not available to Python models in nnserve")


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    raise TritonModelException("the model loading API is not available to Python models in nnserve")


# ---- helpers -----------------------------------------------------------------------------------------------------
def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in inference_request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in inference_response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("input", []) if t.get("name") == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("output", []) if t.get("name") == name), None)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def triton_to_numpy_type(data_type: int) -> Any:
    return _TYPE_NUMBERS.get(int(data_type))


def numpy_to_triton_type(data_type: Any) -> int | None:
    dtype = np.dtype(data_type)
    if dtype.kind in "OS":
        return 13
    for number, np_type in _TYPE_NUMBERS.items():
        if number != 13 and dtype == np.dtype(np_type):
            return number
    return None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | None:
    """Elements as 4-byte little-endian lengths and their bytes, in C order (Triton's BYTES layout)."""
    if input_tensor.size == 0:
        return b""
    if input_tensor.dtype.kind not in "OS":
        return None
    parts = []
    for item in input_tensor.reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts += [struct.pack("<I", len(data)), data]
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    items, pos = [], 0
    while pos < len(encoded_tensor):
        (n,) = struct.unpack_from("<I", encoded_tensor, pos)
        if pos + 4 + n > len(encoded_tensor):
            raise TritonModelException("serialized BYTES tensor: an element runs past the end of the data")
        items.append(bytes(encoded_tensor[pos + 4:pos + 4 + n]))
        pos += 4 + n
    return np.array(items, dtype=object)


# ---- auto_complete_config ----------------------------------------------------------------------------------------
class ModelConfig:
    """The configuration auto_complete_config may extend: max_batch_size, inputs, outputs, dynamic batching and the
    transaction policy (the same checks as Triton's: an input or output that contradicts the config is an
    error)."""

    _INPUT_KEYS = ("name", "data_type", "dims", "optional")
    _OUTPUT_KEYS = ("name", "data_type", "dims")

    def __init__(self, model_config: dict[str, Any] | str):
        self._config = json.loads(model_config) if isinstance(model_config, str) else model_config
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])
        self._config.setdefault("max_batch_size", 0)

    def as_dict(self) -> dict[str, Any]:
        return self._config

    @property
    def _name(self) -> str:
        return str(self._config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        if self._config["max_batch_size"] > max_batch_size:
            raise ValueError(f"configuration specified max_batch_size {self._config['max_batch_size']}, but in "
                             f"auto-complete-config function for model '{self._name}' specified max_batch_size "
                             f"{max_batch_size}")
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._config:
                raise ValueError(f"Configuration specified scheduling_choice as '{scheduler}', but "
                                 f"auto-complete-config function for model '{self._name}' tries to set "
                                 "scheduling_choice as 'dynamic_batching'")
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's parameter name
        self._add("input", input, self._INPUT_KEYS)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, self._OUTPUT_KEYS)

    def _add(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        name = tensor.get("name")
        extra = [k for k in tensor if k not in allowed]
        if extra:
            raise ValueError(f"{kind} '{name}' in auto-complete-config function for model '{self._name}' contains "
                             f"property other than {', '.join(repr(k) for k in allowed)}.")
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                raise ValueError(f"{kind} '{name}' in auto-complete-config function for model '{self._name}' is "
                                 f"missing '{key}' property.")
        for current in self._config[kind]:
            if current.get("name") != name:
                continue
            if current.get("data_type", "TYPE_INVALID") not in ("TYPE_INVALID", tensor["data_type"]):
                raise ValueError(f"unable to load model '{self._name}', configuration expects datatype "
                                 f"{current['data_type']} for {kind} '{name}', model provides {tensor['data_type']}")
            if current.get("dims") and list(current["dims"]) != list(tensor["dims"]):
                raise ValueError(f"model '{self._name}', tensor '{name}': the model expects dims {tensor['dims']} but "
                                 f"the model configuration specifies dims {current['dims']}")
            current.update(tensor)
            return
        self._config[kind].append(dict(tensor))

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        if any(k != "decoupled" for k in transaction_policy_dict):
            raise ValueError(f"model transaction property in auto-complete-config function for model '{self._name}' "
                             "contains property other than 'decoupled'.")
        policy = self._config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != wanted:
                raise ValueError(f"trying to change decoupled property in auto-complete-config for model "
                                 f"'{self._name}', which is already set to '{policy['decoupled']}'.")
            policy["decoupled"] = wanted
