"""One exception hierarchy for the server, mapped once per transport (REST status code, gRPC status code).

Every error a client can see is a ServerError carrying Triton's HTTP status and gRPC status name, so the REST and
gRPC adapters never decide codes themselves.
"""

from __future__ import annotations


class ServerError(Exception):
    """Base of every error the server answers a request with."""

    http_status = 500
    grpc_code = "INTERNAL"
    reason = "OTHER"  # label of nv_inference_request_failure{reason=...}

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidArgumentError(ServerError):
    """The request is malformed: wrong shape, dtype, missing input, bad JSON."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"
    reason = "REJECTED"


class ModelNotFoundError(ServerError):
    """The model (or version) is unknown or not ready."""

    http_status = 400
    grpc_code = "NOT_FOUND"
    reason = "REJECTED"


class ModelNotReadyError(ServerError):
    """The model exists in the repository but is not loaded (Triton answers 400/UNAVAILABLE)."""

    http_status = 400
    grpc_code = "UNAVAILABLE"
    reason = "REJECTED"


class ModelLoadError(ServerError):
    """Loading a model failed; the message names the model and why."""

    http_status = 400
    grpc_code = "INTERNAL"
    reason = "OTHER"


class UnavailableError(ServerError):
    """The server cannot take the request now (shutting down)."""

    http_status = 503
    grpc_code = "UNAVAILABLE"
    reason = "REJECTED"


class QueueFullError(UnavailableError):
    """The dynamic batcher's queue is at max_queue_size."""

    def __init__(self, message: str = "Exceeds maximum queue size"):
        super().__init__(message)


class RequestTimeoutError(ServerError):
    """A request waited in the queue past its timeout."""

    http_status = 504
    grpc_code = "DEADLINE_EXCEEDED"
    reason = "BACKEND"

    def __init__(self, message: str = "Request timeout expired"):
        super().__init__(message)


class InferenceError(ServerError):
    """The engine failed while running a request that passed validation."""

    http_status = 500
    grpc_code = "INTERNAL"
    reason = "BACKEND"
