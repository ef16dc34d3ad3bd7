"""REST JSON and binary-tensor-extension codec for InferRequest/InferResponse.

Binary extension: the body is a JSON header of `Inference-Header-Content-Length` bytes followed by each binary
tensor's bytes, in the order the tensors appear in the JSON (inputs carry parameters.binary_data_size).
"""

from __future__ import annotations

import json
import math
from itertools import chain
from typing import Any

import numpy as np

from server.datatypes import element_size, numpy_to_wire, wire_to_numpy
from server.errors import InvalidArgumentError, UnsupportedError
from server.inference import SHM_REGION, InferInput, InferRequest, InferResponse, RequestedOutput, shm_ref
from server.raw_tensors import tensor_from_raw, tensor_to_raw
from server.request_limits import check_label, element_count, quoted

HEADER_LENGTH = "Inference-Header-Content-Length"
# The most JSON objects a request may hold (a tensor is one, its parameters another). A decoded object costs ~30x
# its text ('{"name":"o"}' is 12 bytes, its dict and what the request makes of it ~400): 60 MiB of outputs took 2 GB
# before the duplicates were refused. No real request names this many tensors.
MAX_JSON_OBJECTS = 65536


def decode_request(model_name: str, version: str, body: bytes, header_length: int | None, *,
                   yielding: bool = False) -> InferRequest:
    """Body (+ optional JSON header length) -> InferRequest. A raw binary body (header length 0) goes through
    raw_binary_request, which needs the model's input.

    `yielding`: decoding runs in a worker thread while the event loop serves other requests. Python lets another
    thread run only between bytecodes, and json.loads and numpy's list conversion are single C calls that take a
    second for 50 MiB; so numbers are parsed through Python-level hooks and lists converted a slice at a time,
    giving the event loop its turn every few milliseconds (at ~1.5x the CPU)."""
    if header_length == 0:
        raise UnsupportedError("raw binary request without the model's input description")
    if header_length is not None and not 0 < header_length <= len(body):
        raise InvalidArgumentError(f"{HEADER_LENGTH} {header_length} is outside the body of {len(body)} bytes")
    head = body[:header_length] if header_length is not None else body
    doc = _parse_json(head, yielding)
    binary = memoryview(body)[header_length:] if header_length is not None else memoryview(b"")
    req = InferRequest(model_name=model_name, model_version=version, id=_request_id(doc.get("id", "")),
                       parameters=_params(doc.get("parameters"), "request"))
    _check_bool_param(req.parameters, "binary_data_output")
    pos = 0
    for item in _list(doc, "inputs"):
        tensor, pos = _decode_input(item, binary, pos, yielding)
        req.inputs.append(tensor)
    if pos != len(binary):
        raise InvalidArgumentError(f"{len(binary) - pos} bytes of binary data are not claimed by any input")
    outputs = doc.get("outputs") or []
    if not isinstance(outputs, list):
        raise InvalidArgumentError("'outputs' must be a list")
    for item in outputs:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidArgumentError("each entry of 'outputs' needs a 'name'")
        check_label(item["name"], "output name")
        out_params = _params(item.get("parameters"), f"output '{item['name']}'")
        _check_bool_param(out_params, "binary_data")
        req.outputs.append(RequestedOutput(item["name"], out_params))
    return req


def _request_id(value: Any) -> str:
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise InvalidArgumentError("the request 'id' must be a string")
    text = str(value)
    check_label(text, "request id")
    return text


class _NonFinite(float):
    """A NaN, Infinity or -Infinity written as such in the request: JSON has no such values, but Triton's parser
    takes them (rapidjson's kParseNanAndInfFlag) and its JSON answers write them, as ours do. Its own type, so that
    an infinity from a number too large for a double (1e400) is still refused as out of range. rapidjson's flag also
    takes `Inf`, `-Inf` and `-NaN`, which no JSON writer we know of emits (Python's, rapidjson's own and
    tritonclient's write the three above): those stay a parse error here (400), a difference from Triton."""


_CONSTANTS = {"NaN": _NonFinite("nan"), "Infinity": _NonFinite("inf"), "-Infinity": _NonFinite("-inf")}


def _constant(name: str) -> float:
    return _CONSTANTS[name]


def raw_binary_request(model_name: str, version: str, body: bytes, name: str, datatype: str,
                       shape: list[int]) -> InferRequest:
    """Triton's raw binary request (Inference-Header-Content-Length: 0): the body is the only input's bytes, batch 1
    (`shape` is the wire shape, -1 for variable dims: at most one besides the batch dim); every output is binary."""
    if datatype == "BYTES":
        dims = [1] * len(shape)
    else:
        dims = [1 if i == 0 and d == -1 else d for i, d in enumerate(shape)]
        if dims.count(-1) > 1:
            raise InvalidArgumentError(f"raw binary request: input '{name}' has more than one variable dim {shape}; "
                                       "send a JSON header with the shape")
        if -1 in dims:
            fixed = math.prod(d for d in dims if d != -1) * element_size(datatype)
            if fixed == 0 or len(body) % fixed:
                raise InvalidArgumentError(f"raw binary request: {len(body)} bytes are not a whole number of "
                                           f"'{name}' rows of shape {shape}")
            dims[dims.index(-1)] = len(body) // fixed
    data = tensor_from_raw(body, datatype, dims, name)
    return InferRequest(model_name=model_name, model_version=version, parameters={"binary_data_output": True},
                        inputs=[InferInput(name, datatype, dims, data)])


def _yielding_float(text: str) -> float:
    return float(text)


def _yielding_int(text: str) -> int:
    return int(text)


# json.loads with any keyword argument builds a decoder per call: this one is json.loads(..., parse_constant=...)
_DECODER = json.JSONDecoder(parse_constant=_constant)


class _TooManyObjects(Exception):
    pass


def _counted_dict(pairs: list[tuple[str, Any]], count: list[int]) -> dict[str, Any]:
    count[0] += 1
    if count[0] > MAX_JSON_OBJECTS:
        raise _TooManyObjects
    return dict(pairs)


def _parse_json(head: bytes, yielding: bool = False) -> dict[str, Any]:
    try:
        if head.count(b"{") > MAX_JSON_OBJECTS:  # braces in strings count too: the objects are counted as parsed
            count = [0]
            hooks = {"parse_float": _yielding_float, "parse_int": _yielding_int} if yielding else {}
            doc = json.loads(head, parse_constant=_constant, **hooks,
                             object_pairs_hook=lambda pairs: _counted_dict(pairs, count))
        elif yielding:
            doc = json.loads(head, parse_constant=_constant, parse_float=_yielding_float,
                             parse_int=_yielding_int)
        else:  # what json.loads does with bytes
            doc = _DECODER.decode(head.decode(json.detect_encoding(head), "surrogatepass"))
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise InvalidArgumentError(f"failed to parse the request JSON: {exc}") from None
    except RecursionError:
        raise InvalidArgumentError("failed to parse the request JSON: nested too deeply") from None
    except _TooManyObjects:
        raise InvalidArgumentError(f"the request JSON holds more than {MAX_JSON_OBJECTS} objects (tensors, "
                                   "parameters)") from None
    if not isinstance(doc, dict):
        raise InvalidArgumentError("the request JSON must be an object")
    return doc


def _params(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{where} 'parameters' must be an object")
    return dict(value)


def _check_bool_param(params: dict[str, Any], key: str) -> None:
    """Triton's rule and words: binary_data / binary_data_output are JSON true or false (the string "false" would
    otherwise count as true)."""
    if key in params and not isinstance(params[key], bool):
        raise InvalidArgumentError(f"Unable to parse '{key}': attempt to access JSON non-boolean as boolean")


def _list(doc: dict[str, Any], key: str) -> list[Any]:
    value = doc.get(key)
    if not isinstance(value, list):
        raise InvalidArgumentError(f"the request JSON needs a list '{key}'")
    return value


def _decode_input(item: Any, binary: memoryview, pos: int, yielding: bool) -> tuple[InferInput, int]:
    if not isinstance(item, dict) or not {"name", "shape", "datatype"} <= item.keys():
        raise InvalidArgumentError("each input needs 'name', 'shape' and 'datatype'")
    name, datatype = item["name"], item["datatype"]
    if not isinstance(name, str) or not isinstance(datatype, str):
        raise InvalidArgumentError("an input's 'name' and 'datatype' must be strings")
    check_label(name, "input name")
    shape = _shape(item["shape"], name)
    params = _params(item.get("parameters"), f"input '{name}'")
    _check_one_source(item, params)
    shm = shm_ref(params, name)
    if shm is not None:  # read by the data plane, which holds the regions
        element_count(shape, name)
        return InferInput(name, datatype, shape, None, shm), pos
    size = params.get("binary_data_size")
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidArgumentError(f"input '{name}': binary_data_size must be a non-negative integer")
        if pos + int(size) > len(binary):
            raise InvalidArgumentError(f"input '{name}': binary_data_size {size} runs past the end of the body")
        data = tensor_from_raw(binary[pos : pos + int(size)], datatype, shape, name)
        return InferInput(name, datatype, shape, data), pos + int(size)
    return InferInput(name, datatype, shape, _json_tensor(item["data"], datatype, shape, name, yielding)), pos


def _check_one_source(item: dict[str, Any], params: dict[str, Any]) -> None:
    """Triton's rule and words: an input's bytes come from exactly one of data, the binary extension or shared
    memory."""
    sources = [s for s, given in (("data", "data" in item), ("binary_data_size", "binary_data_size" in params),
                                  (SHM_REGION, SHM_REGION in params)) if given]
    if len(sources) != 1:
        found = " no field is set" if not sources else " set " + " ".join(f"'{s}'" for s in sources)
        raise InvalidArgumentError("Input must set only one of the following fields: 'data', 'binary_data_size' in "
                                   f"'parameters', 'shared_memory_region' in 'parameters'. But{found}")


def _shape(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in value):
        raise InvalidArgumentError(f"input '{name}': shape must be a list of non-negative integers, got "
                                   f"{quoted(repr(value))}")
    element_count(value, name)
    return value


# Triton reads FP16 and BF16 only as binary data (JSON numbers are doubles; it does not round them to half
# precision), and refuses them in JSON in these words.
BINARY_ONLY = ("FP16", "BF16")


def _json_tensor(data: Any, datatype: str, shape: list[int], name: str, yielding: bool = False) -> np.ndarray:
    count = element_count(shape, name)
    if not isinstance(data, list):
        raise InvalidArgumentError(f"input '{name}': 'data' must be a list")
    if data and not isinstance(data[0], list) and len(data) != count:  # flat: counted before converting
        raise InvalidArgumentError(f"input '{name}': {len(data)} values in 'data', but shape {shape} needs {count}")
    if datatype in BINARY_ONLY:
        raise InvalidArgumentError(f"receiving {datatype} data via JSON is not supported. Please use the binary data "
                                   f"format for input {name}")
    try:
        if datatype == "BYTES":
            arr = _json_bytes(np.asarray(data, dtype=object).reshape(-1), name)
        else:
            arr = _numbers(data, datatype, name, yielding).reshape(-1)
    except (TypeError, ValueError, OverflowError) as exc:  # ValueError: nested lists of different lengths
        raise InvalidArgumentError(f"input '{name}': data is not valid {datatype}: {quoted(str(exc), 200)}") from None
    except RecursionError:
        raise InvalidArgumentError(f"input '{name}': data is nested too deeply") from None
    if arr.size != count:
        raise InvalidArgumentError(f"input '{name}': {arr.size} values in 'data', but shape {shape} needs {count}")
    return arr.reshape(shape)


# Elements converted per numpy call when yielding: a few milliseconds each.
SLICE = 1 << 16


def _numbers(data: list[Any], datatype: str, name: str, yielding: bool) -> np.ndarray:
    """`data` as an array of `datatype`, checked by _checked_numbers; a slice of rows at a time when yielding (see
    decode_request), emptying `data`."""
    dtype = wire_to_numpy(datatype)
    if not yielding or not data:
        return _checked_numbers(data, dtype, datatype, name, 0)
    per_row, first = 1, data[0]
    while isinstance(first, list) and first:
        per_row, first = per_row * len(first), first[0]
    rows = max(1, SLICE // max(per_row, 1))
    # From the end, deleting what is converted: freeing millions of parsed numbers at once when the document is
    # dropped would be another long C call; this way each slice's are freed with it.
    parts, end = [], len(data)
    while end > 0:
        start = max(end - rows, 0)
        parts.append(_checked_numbers(data[start:end], dtype, datatype, name, start * per_row))
        del data[start:end]
        end = start
    parts.reverse()
    if len({p.shape[1:] for p in parts}) > 1:
        raise ValueError("the nested lists of 'data' differ in length")
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


# The JSON values each kind of datatype takes, as Triton reads them (rapidjson's AsBool / AsInt / AsUInt / AsDouble):
# true/false for BOOL; integers for the integer types (not true/false, not 1.9 or 2.0: numpy would make 1 of each);
# numbers for the floating-point ones (not true/false, strings or null: numpy would make 1.0, parse "nan", make NaN).
_TAKES = {"b": ({bool}, "true or false"), "i": ({int}, "an integer"), "u": ({int}, "an integer"),
          "f": ({int, float, _NonFinite}, "a number")}


def _checked_numbers(rows: list[Any], dtype: np.dtype, datatype: str, name: str, offset: int) -> np.ndarray:
    """np.asarray(rows, dtype) for values of the JSON types `datatype` takes, each within its range (integers by
    numpy's own check; floats finite once cast unless written NaN or Infinity: another is a value too large). The types
    are learnt in one pass over the flattened values, so the common case has no per-element Python code; the
    offending element is looked for only when something is wrong. `offset`: the flat index of rows[0]'s first."""
    flat = _flattened(rows)
    accepted, wanted = _TAKES[dtype.kind]
    if not set(map(type, flat)) <= accepted:
        i, value = next((i, v) for i, v in enumerate(flat) if type(v) not in accepted)
        if isinstance(value, list):
            raise ValueError("the nested lists of 'data' differ in length")
        raise _bad_element(name, datatype, offset + i, value, f"not {wanted}")
    try:
        with np.errstate(over="ignore"):  # a float too large for the dtype: found by isfinite below
            arr = np.asarray(rows, dtype=dtype)
    except OverflowError:  # a Python integer outside the dtype's range
        arr = None
    if arr is None or (dtype.kind == "f" and not np.isfinite(arr).all() and not _written_non_finite(arr, flat)):
        i = next(i for i, v in enumerate(flat) if not _fits(v, dtype))
        raise _bad_element(name, datatype, offset + i, flat[i], f"outside the range of {datatype}")
    return arr


def _flattened(rows: list[Any]) -> list[Any]:
    """The values of nested lists, as deep as the first element's nesting (a deeper or shallower value shows up as a
    list among the values, or a count numpy refuses)."""
    flat = rows
    while flat and type(flat[0]) is list:
        if set(map(type, flat)) != {list}:
            raise ValueError("the nested lists of 'data' differ in length")
        flat = list(chain.from_iterable(flat))
    return flat


def _written_non_finite(arr: np.ndarray, flat: list[Any]) -> bool:
    """Whether every value of `arr` that is not finite was written NaN, Infinity or -Infinity."""
    return all(type(flat[i]) is _NonFinite for i in np.flatnonzero(~np.isfinite(arr.reshape(-1))))


def _fits(value: int | float, dtype: np.dtype) -> bool:
    if type(value) is _NonFinite:
        return dtype.kind == "f"
    try:
        with np.errstate(over="ignore"):
            cast = np.asarray([value], dtype=dtype)
    except OverflowError:
        return False
    return dtype.kind != "f" or bool(np.isfinite(cast).all())


def _bad_element(name: str, datatype: str, index: int, value: Any, why: str) -> InvalidArgumentError:
    shown = quoted(json.dumps(value, allow_nan=True), 40)
    return InvalidArgumentError(f"input '{name}': data is not valid {datatype}: element {index} is {shown}, {why}")


def _json_bytes(flat: np.ndarray, name: str) -> np.ndarray:
    """BYTES in JSON are strings (never bytes(n): an integer there would allocate n bytes)."""
    out = np.empty(flat.size, dtype=object)
    for i, v in enumerate(flat):
        if not isinstance(v, str):
            kind = "float" if isinstance(v, _NonFinite) else type(v).__name__  # a JSON NaN is a number to the user
            raise InvalidArgumentError(f"input '{name}': BYTES data must be strings, got {kind}")
        out[i] = v.encode("utf-8", "surrogatepass")
    return out


def encode_response(resp: InferResponse, req: InferRequest) -> tuple[bytes, int | None]:
    """InferResponse -> (body, json_header_length or None when every output is JSON)."""
    default_binary = bool(req.parameters.get("binary_data_output", False))
    wanted = {o.name: o.parameters for o in req.outputs}
    outputs, chunks = [], []
    for out in resp.outputs:
        entry: dict[str, Any] = {"name": out.name, "datatype": out.datatype, "shape": list(out.shape)}
        if out.in_shared_memory:  # as Triton: the tensor is in the region, the response only describes it
            pass
        elif wanted.get(out.name, {}).get("binary_data", default_binary):
            raw = tensor_to_raw(out.data)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _json_data(out.data, out.name)
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": resp.model_name, "model_version": resp.model_version, "outputs": outputs}
    if resp.id:
        doc["id"] = resp.id
    if resp.parameters:
        doc["parameters"] = resp.parameters
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not chunks:
        return head, None
    return head + b"".join(chunks), len(head)


def _json_data(arr: np.ndarray, name: str) -> list[Any]:
    if numpy_to_wire(arr.dtype) == "BYTES":
        return [_json_string(v, name) if isinstance(v, bytes) else str(v) for v in arr.reshape(-1)]
    return arr.reshape(-1).tolist()


def _json_string(value: bytes, name: str) -> str:
    """A BYTES element as a JSON string, which holds text only: bytes that are not UTF-8 cannot travel in JSON
    unaltered (Triton writes them raw, making the response invalid JSON), so the client is asked for binary."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgumentError(f"output '{name}' holds bytes that are not UTF-8 (at byte {exc.start} of an "
                                   "element), which JSON cannot carry; request it with \"binary_data\": true") from None
