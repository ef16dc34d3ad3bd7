"""What the OpenAPI schema (served at /openapi.json) says about the routes that read their body by hand: request
bodies of infer / repository calls and the error answers each route can give (`{"error": str}` with Triton's codes).
The handlers parse bodies themselves (binary extension, size limits), so these are declared here, not inferred.
"""

from __future__ import annotations

from typing import Any

ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for the error codes a route may answer."""
    text = {400: "Invalid request", 403: "Restricted API (--http-restricted-api) without its header",
            404: "Model or version not found", 413: "Body over --http-max-input-size",
            499: "Client closed the request", 500: "Inference failed in the engine",
            501: "Unsupported feature", 503: "Model not ready, queue full, request timeout or server exiting"}
    return {c: {"description": text[c], "content": {"application/json": {"schema": ERROR_SCHEMA}}} for c in codes}


# health answers carry no body: the status code is the answer
EMPTY_OK: dict[str, Any] = {"description": "Yes (empty body)"}
NOT_READY: dict[str, Any] = {"description": "Not ready (empty body)"}

_PARAMETERS = {"type": "object", "additionalProperties": {"anyOf": [
    {"type": "string"}, {"type": "number"}, {"type": "integer"}, {"type": "boolean"}]}}

_INPUT = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "datatype": {"type": "string", "enum": ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
                                                "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES"]},
        "parameters": _PARAMETERS,
        "data": {"type": "array", "description": "row-major values, flat or nested"},
    },
}

INFER_REQUEST = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": _PARAMETERS,
        "inputs": {"type": "array", "items": _INPUT},
        "outputs": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "parameters": _PARAMETERS}}},
    },
}

INFER_EXTRA = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": INFER_REQUEST},
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"},
                "description": "binary tensor extension: JSON header of Inference-Header-Content-Length bytes, "
                               "then the tensors' bytes"},
        },
    },
    "parameters": [{"name": "Inference-Header-Content-Length", "in": "header", "required": False,
                    "schema": {"type": "integer", "minimum": 0}}],
}
INFER_RESPONSES = {200: {"description": "Inference response (JSON, or JSON header + binary tensors)",
                         "content": {"application/json": {"schema": {"type": "object"}},
                                     "application/octet-stream": {"schema": {"type": "string",
                                                                             "format": "binary"}}}},
                   **errors(400, 403, 404, 413, 499, 500, 501, 503)}

INDEX_EXTRA = {"requestBody": {"required": False, "content": {"application/json": {"schema": {
    "type": "object", "properties": {"ready": {"type": "boolean"}}}}}}}
LOAD_EXTRA = {"requestBody": {"required": False, "content": {"application/json": {"schema": {
    "type": "object", "properties": {"parameters": {"type": "object", "properties": {
        "config": {"type": "string", "description": "model configuration as JSON"}},
        "additionalProperties": {"type": "string", "description": "'file:<version>/<name>': a model file, base64"},
    }}}}}}}

SHM_REGISTER_EXTRA = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["key", "byte_size"], "properties": {
        "key": {"type": "string", "description": "the shared-memory object's name in /dev/shm"},
        "offset": {"type": "integer", "minimum": 0}, "byte_size": {"type": "integer", "minimum": 1},
        "raw_handle": {"type": "object", "description": "CUDA regions: the cudaIpcMemHandle_t, base64"},
        "device_id": {"type": "integer", "minimum": 0}}}}}}}
SHM_STATUS_OK = {"description": "Registered regions", "content": {"application/json": {"schema": {
    "type": "array", "items": {"type": "object"}}}}}
_SETTING = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}, {"type": "null"}]}
TRACE_EXTRA = {"requestBody": {"required": False, "content": {"application/json": {"schema": {
    "type": "object", "properties": {k: _SETTING for k in ("trace_level", "trace_rate", "trace_count",
                                                           "log_frequency")}}}}}}
LOGGING_EXTRA = {"requestBody": {"required": False, "content": {"application/json": {"schema": {
    "type": "object", "properties": {
        "log_info": {"type": "boolean"}, "log_warning": {"type": "boolean"}, "log_error": {"type": "boolean"},
        "log_verbose_level": {"type": "integer", "minimum": 0},
        "log_format": {"type": "string", "enum": ["default", "ISO8601", "json"]}}}}}}}
