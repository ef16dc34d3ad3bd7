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


class NotFoundError(ServerError):
    """What the request names does not exist (Triton: NOT_FOUND / 404): a model, a shared-memory region."""

    http_status = 404
    grpc_code = "NOT_FOUND"
    reason = "REJECTED"


class ModelNotFoundError(NotFoundError):
    """The model is known but not loaded, or the version is absent (Triton: NOT_FOUND / 404)."""


class UnknownModelError(ModelNotFoundError):
    """The model name is in no repository. Triton 2.51 answers NOT_FOUND / 404 "Request for unknown model: 'NAME'
    is not found" (its core's ModelLifeCycle::GetModel; INVALID_ARG only with model namespacing on)."""


class ModelNotReadyError(ServerError):
    """The version exists but is loading or unloading (Triton: UNAVAILABLE / 503)."""

    http_status = 503
    grpc_code = "UNAVAILABLE"
    reason = "REJECTED"


class UnsupportedError(ServerError):
    """The request asks for a feature the server does not have (Triton: UNSUPPORTED)."""

    http_status = 501
    grpc_code = "UNIMPLEMENTED"
    reason = "REJECTED"


class ModelLoadError(InvalidArgumentError):
    """Loading a model failed; the message names the model and why (Triton answers 400 / INVALID_ARGUMENT)."""

    reason = "OTHER"


class RepositoryPollError(ServerError):
    """A load whose model directory cannot be read: a name the repository does not have, or model files sent
    through the load API that cannot be written. Triton 2.51 answers INTERNAL / 500 "failed to load 'NAME', failed
    to poll from model repository", and clients match that text and code."""

    reason = "OTHER"


class AlreadyExistsError(ServerError):
    """A name already taken, e.g. a shared-memory region registered twice (Triton: ALREADY_EXISTS, HTTP 400)."""

    http_status = 400
    grpc_code = "ALREADY_EXISTS"
    reason = "REJECTED"


class ModelControlError(InvalidArgumentError):
    """Repository load/unload requested while model control mode is not explicit."""


class UnavailableError(ServerError):
    """The server cannot take the request now (shutting down)."""

    http_status = 503
    grpc_code = "UNAVAILABLE"
    reason = "REJECTED"


class QueueFullError(UnavailableError):
    """The dynamic batcher's queue is at max_queue_size."""

    def __init__(self, message: str = "Exceeds maximum queue size"):
        super().__init__(message)


class RequestTimeoutError(UnavailableError):
    """A request waited in the queue past its timeout (Triton: UNAVAILABLE, counted as REJECTED)."""

    def __init__(self, message: str = "Request timeout expired"):
        super().__init__(message)


class PayloadTooLargeError(ServerError):
    """The request body is over --http-max-input-size (before or after decompression)."""

    http_status = 413
    grpc_code = "RESOURCE_EXHAUSTED"
    reason = "REJECTED"


class ClientDisconnectedError(ServerError):
    """The client hung up before the answer; nobody reads this (Triton: CANCELLED)."""

    http_status = 499
    grpc_code = "CANCELLED"
    reason = "CANCELED"


class InferenceError(ServerError):
    """The engine failed while running a request that passed validation."""

    http_status = 500
    grpc_code = "INTERNAL"
    reason = "BACKEND"


class ListenError(Exception):
    """An endpoint cannot listen on its address (port taken, address not local): the server exits 1 with this one
    line. Not a ServerError: no client ever sees it."""
