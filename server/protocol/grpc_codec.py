"""gRPC codec: ModelInferRequest/ModelInferResponse <-> InferRequest/InferResponse.

Inputs come as typed `contents` or as `raw_input_contents` (one bytes entry per input, in order); outputs always
go back in `raw_output_contents`, as Triton does and tritonclient expects.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from server.datatypes import wire_to_numpy
from server.errors import InvalidArgumentError
from server.inference import InferInput, InferRequest, InferResponse, RequestedOutput, ShmRef, StreamResponse, shm_ref
from server.protocol.grpc import pb2
from server.protocol.grpc_wire import InferMessage, response_parts
from server.raw_tensors import tensor_from_raw, tensor_raw_view, tensor_to_raw
from server.request_limits import MAX_NAME_BYTES, check_label, element_count

# Stream responses carry whether they are their request's last; a client asks for the final flag alone (a decoupled
# model's response-less end) with the second (Triton's names).
FINAL_PARAM = "triton_final_response"
EMPTY_FINAL_PARAM = "triton_enable_empty_final_response"
# An error answered on a stream quotes the request's names; both are cut so that grpc's frame stays small.
MAX_ID_CHARS = 2048
MAX_ERROR_CHARS = 8192

# Which typed InferTensorContents field carries each datatype (FP16/BF16 have none: raw only).
_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}

# Datatypes narrower than their contents field's 32 bits: numpy's cast would wrap (INT8 1000 -> -24) where Triton
# keeps the low bytes; a value out of range is refused instead (the REST decoder refuses it too).
_NARROWED = frozenset({"INT8", "INT16", "UINT8", "UINT16"})


def params_from_grpc(params: Any) -> dict[str, Any]:
    out = {}
    for key, p in params.items():
        which = p.WhichOneof("parameter_choice")
        out[key] = getattr(p, which) if which else None
    return out


def params_to_grpc(values: dict[str, Any], target: Any) -> None:
    for key, v in values.items():
        if isinstance(v, bool):
            target[key].bool_param = v
        elif isinstance(v, int):
            target[key].int64_param = v
        elif isinstance(v, float):
            target[key].double_param = v
        else:
            target[key].string_param = str(v)


def decode_request(request: Any) -> InferRequest:
    """A ModelInferRequest, or an InferMessage (grpc_wire: raw inputs as views of the received bytes)."""
    if isinstance(request, InferMessage):
        msg, raw = request.message, request.raw
    else:
        msg, raw = request, request.raw_input_contents
    # Each protobuf field read builds a Python object: every field is read once.
    params = msg.parameters
    check_label(msg.id, "request id")
    req = InferRequest(model_name=msg.model_name, model_version=msg.model_version, id=msg.id,
                       parameters=params_from_grpc(params) if params else {})
    inputs = msg.inputs
    # raw_input_contents holds, in order, the inputs that are not in shared memory (Triton's rule)
    refs = [_input_shm(t) for t in inputs]
    if raw:  # Triton checks each input for contents mixed with raw contents before it counts the raw entries
        mixed = next((t.name for t, shm in zip(inputs, refs, strict=True) if shm is None and t.HasField("contents")),
                     None)
        if mixed is not None:
            raise InvalidArgumentError(f"contents field must not be specified when using raw_input_contents for "
                                       f"'{mixed}' for model '{msg.model_name[:MAX_NAME_BYTES]}'")  # Triton's words
        if len(raw) != refs.count(None):
            raise InvalidArgumentError(f"raw_input_contents has {len(raw)} entries for {refs.count(None)} inputs")
    next_raw = 0
    for t, shm in zip(inputs, refs, strict=True):
        name, datatype, shape = t.name, t.datatype, list(t.shape)
        check_label(name, "input name")
        if shape and min(shape) < 0:
            raise InvalidArgumentError(f"input '{name}': shape {shape[:8]} has a negative dim")
        model = msg.model_name[:MAX_NAME_BYTES]
        if shm is not None:
            if t.HasField("contents"):  # Triton's words
                raise InvalidArgumentError(f"unexpected 'content' provided when using shared memory for input tensor "
                                           f"'{name}' for model '{model}'")
            element_count(shape, name)
            req.inputs.append(InferInput(name, datatype, shape, None, shm))
            continue
        if raw:  # no input here has contents (checked above)
            data = tensor_from_raw(raw[next_raw], datatype, shape, name)
            next_raw += 1
        else:
            data = _typed_contents(t, shape)
        req.inputs.append(InferInput(name, datatype, shape, data))
    for o in msg.outputs:
        check_label(o.name, "output name")
        out_params = o.parameters
        req.outputs.append(RequestedOutput(o.name, params_from_grpc(out_params) if out_params else {}))
    return req


def _input_shm(t: Any) -> ShmRef | None:
    params = t.parameters
    return shm_ref(params_from_grpc(params), t.name) if params else None


def _typed_contents(t: Any, shape: list[int]) -> np.ndarray:
    field = _CONTENTS_FIELD.get(t.datatype)
    if field is None:
        raise InvalidArgumentError(f"input '{t.name}': datatype {t.datatype} must be sent in raw_input_contents")
    count = element_count(shape, t.name)
    values = getattr(t.contents, field)
    if len(values) != count:
        raise InvalidArgumentError(f"input '{t.name}': {len(values)} values in contents.{field}, but shape "
                                   f"{shape} needs {count}")
    if t.datatype == "BYTES":
        return np.array(list(values), dtype=object).reshape(shape)
    dtype = wire_to_numpy(t.datatype)
    if t.datatype not in _NARROWED:
        return np.asarray(values, dtype=dtype).reshape(shape)
    wide = np.asarray(values, dtype=np.int32 if field == "int_contents" else np.uint32)
    limits = np.iinfo(dtype)
    outside = (wide < limits.min) | (wide > limits.max)
    if outside.any():
        i = int(np.argmax(outside))
        raise InvalidArgumentError(f"input '{t.name}': contents.{field}[{i}] is {int(wide[i])}, outside the range of "
                                   f"{t.datatype} [{limits.min}, {limits.max}]")
    return wide.astype(dtype).reshape(shape)


def encode_response(resp: InferResponse) -> Any:
    msg = pb2.ModelInferResponse(model_name=resp.model_name, model_version=resp.model_version, id=resp.id)
    params_to_grpc(resp.parameters, msg.parameters)
    for out in resp.outputs:
        msg.outputs.add(name=out.name, datatype=out.datatype, shape=list(out.shape))
        msg.raw_output_contents.append(b"" if out.in_shared_memory else tensor_to_raw(out.data))
    return msg


def encode_response_parts(resp: InferResponse, extra_params: dict[str, Any] | None = None) -> list[Any]:
    """The response as grpc_wire.response_parts: the raw outputs are not copied until grpc's serializer joins them."""
    msg = pb2.ModelInferResponse(model_name=resp.model_name, model_version=resp.model_version, id=resp.id)
    params_to_grpc({**resp.parameters, **(extra_params or {})}, msg.parameters)
    for out in resp.outputs:
        msg.outputs.add(name=out.name, datatype=out.datatype, shape=list(out.shape))
    # an output written to shared memory keeps its (empty) place: raw outputs pair with outputs by position
    return response_parts(msg, [b"" if out.in_shared_memory else tensor_raw_view(out.data) for out in resp.outputs])


def encode_stream_response(item: StreamResponse, request: Any) -> Any:
    """One ModelStreamInferResponse, triton_final_response set: a response as the parts of response_parts (wrapped by
    grpc_wire.serialize_stream_response); an error or the final flag alone as a message with the request's id, model
    and version and the error's message."""
    if item.response is not None and item.error is None:
        return encode_response_parts(item.response, {FINAL_PARAM: item.final})
    head = request.message if isinstance(request, InferMessage) else request
    resp = pb2.ModelInferResponse(id=head.id[:MAX_ID_CHARS], model_name=head.model_name[:MAX_ID_CHARS],
                                  model_version=head.model_version[:MAX_ID_CHARS])
    resp.parameters[FINAL_PARAM].bool_param = item.final
    msg = pb2.ModelStreamInferResponse(infer_response=resp)
    if item.error is not None:
        msg.error_message = item.error.message[:MAX_ERROR_CHARS]
    return msg
