"""GRPCInferenceService over the data plane. ServerErrors map to gRPC status codes in one place (`_guard`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import json_format

from server.dataplane import GRPC_ENDPOINT, DataPlane
from server.errors import InvalidArgumentError, ServerError, UnavailableError
from server.inference import InferRequest, StreamResponse
from server.model_upload import file_parameters
from server.protocol import grpc_codec, grpc_wire
from server.protocol.grpc import health_pb2, health_pb2_grpc, pb2, pb2_grpc
from server.protocol.grpc.interceptors import Codec, add_guarded
from server.settings import (
    GRPC_MAX_MESSAGE_BYTES,
    STREAM_MAX_INFLIGHT,
    STREAM_MAX_PENDING_RESPONSES,
    STREAMS_MAX_INFLIGHT,
)

log = logging.getLogger("nnserve.grpc")


def status_of(err: ServerError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, err.grpc_code, grpc.StatusCode.INTERNAL)


# gRPC carries the message in a trailer, percent-encoded (up to 3x), and a trailer over grpc's metadata limit (8 KiB
# by default) fails the whole answer with RESOURCE_EXHAUSTED: an error quoting a huge name must still arrive.
MAX_DETAILS_CHARS = 2048


def bounded(message: str) -> str:
    return message if len(message) <= MAX_DETAILS_CHARS else message[:MAX_DETAILS_CHARS] + "... (truncated)"


def fail(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> None:
    """Answer the call with `code` by setting it, not by context.abort: abort keeps an AbortError in the call's state
    whose traceback holds the handler's frames, which hold the context: a reference cycle that pins the request
    (its whole payload) until the cyclic GC runs."""
    context.set_code(code)
    context.set_details(bounded(message))


def _guard(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """The single ServerError -> gRPC status mapping for every unary rpc."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except ServerError as err:
            code, message = status_of(err), err.message
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # a bug: answer INTERNAL with the message, log the traceback
            log.exception("%s failed", method.__name__)
            code, message = grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"
        # out of the except blocks: the exception, its traceback and the frames holding the request are gone
        fail(context, code, message)
        return None  # grpc discards the response of a call whose code is not OK

    return wrapper


async def decoded(request: Any, max_input_bytes: int = GRPC_MAX_MESSAGE_BYTES, arrival_ns: int = 0) -> InferRequest:
    """A large message (grpc_wire scanned it) is decoded in a worker thread: BYTES elements are unpacked one by one
    in Python, and the event loop keeps serving meanwhile. Its shared-memory inputs may hold `max_input_bytes`, as
    many as a message may carry. The request's time in the server starts at `arrival_ns` (a stream's read), else
    now, before decoding."""
    arrival = arrival_ns or time.perf_counter_ns()
    if isinstance(request, grpc_wire.InferMessage):
        req = await asyncio.to_thread(grpc_codec.decode_request, request)
    else:
        req = grpc_codec.decode_request(request)
    req.max_shm_input_bytes = max_input_bytes
    req.arrival_ns = arrival
    return req


def metadata_value(context: Any, key: str) -> str:
    """A request metadata entry's value ('' when absent)."""
    return next((str(v) for k, v in (context.invocation_metadata() or ()) if k == key), "")


_READ_FAILED = object()  # on a stream's answer queue: reading its requests raised
_REQUEST_DONE = object()  # on a stream's answer queue: a request's responses are all there


def _take_turn(turn: asyncio.Future[None]) -> None:
    if not turn.done():
        turn.set_result(None)


class _Unwritten:
    """How many responses of a stream are on its answer queue, not yet written."""

    def __init__(self) -> None:
        self.count = 0


@dataclass(frozen=True)
class StreamLimits:
    """ModelStreamInfer backpressure: requests read but not yet answered (their response not yet written), per
    stream and over all streams of the server. At a limit the server stops reading the stream, so HTTP/2 flow
    control holds the client back.

    A decoupled request makes any number of responses, which the reading limits above do not bound: at most
    `pending_responses` may wait to be written per stream. The request whose response would be one more gets an
    error as its final response and is cancelled (its later responses are dropped). An error rather than holding
    the model's response sender back: the sender is the model's own thread (a Python model's worker process), and
    blocking it on a client that never reads would hold the instance, and every other client of it, for good."""

    per_stream: int = STREAM_MAX_INFLIGHT
    per_server: int = STREAMS_MAX_INFLIGHT
    pending_responses: int = STREAM_MAX_PENDING_RESPONSES


class InferenceServicer(pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dp: DataPlane, stream_limits: StreamLimits | None = None,
                 max_input_bytes: int = GRPC_MAX_MESSAGE_BYTES, trace_context: bool = False):
        self.dp = dp
        self.trace_context = trace_context  # a request's metadata is read only for it (a cost per request)
        self.stream_limits = stream_limits or StreamLimits()
        self.max_input_bytes = max_input_bytes  # a request's shared-memory inputs count like a message's bytes
        self._stream_slots: asyncio.Semaphore | None = None  # made on first use, inside the server's event loop

    @_guard
    async def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802 - rpc names are the protocol's
        return pb2.ServerLiveResponse(live=self.dp.live())

    @_guard
    async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb2.ServerReadyResponse(ready=self.dp.ready())

    @_guard
    async def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb2.ModelReadyResponse(ready=self.dp.model_ready(request.name, request.version))

    @_guard
    async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb2.ServerMetadataResponse(**self.dp.server_metadata())

    @_guard
    async def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        meta = self.dp.model_metadata(request.name, request.version)
        return json_format.ParseDict(meta, pb2.ModelMetadataResponse())

    @_guard
    async def ModelConfig(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb2.ModelConfigResponse(config=self.dp.model_config(request.name, request.version))

    @_guard
    async def ModelStatistics(self, request: Any, context: Any) -> Any:  # noqa: N802
        stats = self.dp.statistics(request.name, request.version)
        return json_format.ParseDict({"model_stats": stats}, pb2.ModelStatisticsResponse())

    @_guard
    async def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
        req = await decoded(request, self.max_input_bytes)
        if self.trace_context:
            req.traceparent = metadata_value(context, "traceparent")
        resp = await self.dp.infer(req, GRPC_ENDPOINT)
        return grpc_codec.encode_response_parts(resp)  # joined by grpc_wire.serialize_response

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:  # noqa: N802
        """Requests on one stream run concurrently (so they can batch); responses go back as they finish.
        Errors go into error_message and the stream stays open, as Triton does. At most stream_limits requests are
        between being read and their response being written (see StreamLimits)."""
        if self._stream_slots is None:
            self._stream_slots = asyncio.Semaphore(self.stream_limits.per_server)
        server_slots, own_slots = self._stream_slots, asyncio.Semaphore(self.stream_limits.per_stream)
        done: asyncio.Queue[Any] = asyncio.Queue()
        held = 0  # server slots this stream holds
        tasks: set[asyncio.Task] = set()
        unwritten = _Unwritten()
        traceparent = metadata_value(context, "traceparent") if self.trace_context else ""

        async def read_all() -> None:
            nonlocal held
            iterator = aiter(request_iterator)
            turn: asyncio.Future[None] | None = None  # set once the previous request went to the data plane
            while True:
                await own_slots.acquire()
                await server_slots.acquire()
                held += 1
                try:
                    request = await anext(iterator)
                except StopAsyncIteration:
                    break
                arrival = time.perf_counter_ns()
                previous, turn = turn, asyncio.get_running_loop().create_future()
                task = asyncio.create_task(self._stream_one(request, done, arrival, previous, turn, unwritten,
                                                            traceparent))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                del request, task
            own_slots.release()
            server_slots.release()
            held -= 1
            while tasks:
                await asyncio.gather(*tasks)
            await done.put(None)

        reader = asyncio.create_task(read_all())
        reader.add_done_callback(lambda t: t.cancelled() or t.exception() is None or done.put_nowait(_READ_FAILED))
        try:
            while (entry := await done.get()) is not None:
                if entry is _READ_FAILED:
                    reader.result()  # raises what ended the reading
                if entry is not _REQUEST_DONE:
                    yield entry
                    del entry
                    unwritten.count -= 1
                    continue
                held -= 1  # a request's responses are all written: its slots go to the next one
                server_slots.release()
                own_slots.release()
        finally:
            reader.cancel()
            for task in tasks:
                task.cancel()
            for _ in range(held):  # the answers never written: their slots go back to the other streams
                server_slots.release()

    async def _stream_one(self, request: Any, done: asyncio.Queue[Any], arrival_ns: int,
                          previous: asyncio.Future[None] | None, turn: asyncio.Future[None],
                          unwritten: _Unwritten, traceparent: str = "") -> None:
        """Every response of one request (a decoupled model's 0..n), each marked triton_final_response as Triton
        marks it; the final flag alone goes out only to a client that asked for it. _REQUEST_DONE follows the last:
        the request's stream slots are held until then, whatever number of responses it had.

        Requests reach their scheduler in the stream's order (a sequence's requests must reach its model in order),
        though a large one is decoded (or its shared-memory inputs read) in a worker thread: each waits for
        `previous` (its predecessor's turn) before it goes on to the data plane, and sets `turn` as the data plane
        hands it to its scheduler (or as it ends, if it never gets there). The scheduler queues it before anything
        suspends, so the successor, woken by `turn`, runs only once this one is queued."""
        try:
            try:
                req = await decoded(request, self.max_input_bytes, arrival_ns)
            finally:
                if previous is not None:  # decoded or not, this request's turn comes after its predecessor's
                    await asyncio.shield(previous)
            empty_final = req.parameters.pop(grpc_codec.EMPTY_FINAL_PARAM, False) is True
            req.traceparent = traceparent  # the stream's: its metadata comes once, with the call
            req.on_scheduled = functools.partial(_take_turn, turn)
            async with contextlib.aclosing(self.dp.infer_stream(req)) as responses:
                async for one in responses:
                    if not (one.response is not None or one.error is not None or empty_final):
                        continue
                    if not one.final and unwritten.count >= self.stream_limits.pending_responses:
                        # leaving the generator cancels the request; its model's later responses are dropped
                        raise UnavailableError(
                            f"more than {self.stream_limits.pending_responses} responses of this stream wait to be "
                            "written (the client does not read them): the request is cancelled "
                            "(--grpc-stream-max-pending-responses)")
                    unwritten.count += 1
                    done.put_nowait(grpc_codec.encode_stream_response(one, request))
        except ServerError as err:
            unwritten.count += 1
            done.put_nowait(grpc_codec.encode_stream_response(StreamResponse(None, err), request))
        except Exception as exc:  # a bug: the stream still answers this request and stays open for the others
            unwritten.count += 1
            log.exception("ModelStreamInfer request failed")
            done.put_nowait(_stream_error(f"internal error: {type(exc).__name__}: {exc}", request))
        finally:
            _take_turn(turn)
            done.put_nowait(_REQUEST_DONE)

    @_guard
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:  # noqa: N802
        rows = self.dp.repository_index(request.ready)
        return json_format.ParseDict({"models": rows}, pb2.RepositoryIndexResponse())

    @_guard
    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:  # noqa: N802
        params = request.parameters
        config = params["config"].string_param if "config" in params else None
        files = {}
        for key in file_parameters(params):
            if params[key].WhichOneof("parameter_choice") != "bytes_param":  # Triton's words
                raise InvalidArgumentError(f"File parameter '{key}' must have bytes type for its value")
            files[key] = params[key].bytes_param
        await self.dp.load_model(request.model_name, config, files)
        return pb2.RepositoryModelLoadResponse()

    @_guard
    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:  # noqa: N802
        await self.dp.unload_model(request.model_name)
        return pb2.RepositoryModelUnloadResponse()


    # ---- shared memory, trace, logging ---------------------------------------------------------------------
    @_guard
    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        regions = {r["name"]: r for r in self.dp.shm_status(request.name)}
        return json_format.ParseDict({"regions": regions}, pb2.SystemSharedMemoryStatusResponse())

    @_guard
    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.dp.shm_register(request.name, request.key, request.offset, request.byte_size)
        return pb2.SystemSharedMemoryRegisterResponse()

    @_guard
    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.dp.shm_unregister(request.name)
        return pb2.SystemSharedMemoryUnregisterResponse()

    @_guard
    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.dp.cuda_shm_status(request.name)  # no CUDA region is ever registered
        return pb2.CudaSharedMemoryStatusResponse()

    @_guard
    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.dp.cuda_shm_register(request.name)
        return pb2.CudaSharedMemoryRegisterResponse()

    @_guard
    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.dp.cuda_shm_unregister(request.name)
        return pb2.CudaSharedMemoryUnregisterResponse()

    @_guard
    async def TraceSetting(self, request: Any, context: Any) -> Any:  # noqa: N802
        update = {key: list(value.value) for key, value in request.settings.items()}  # [] clears a setting
        settings = self.dp.trace_settings(request.model_name, update)
        response = pb2.TraceSettingResponse()
        for key, value in settings.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    @_guard
    async def LogSettings(self, request: Any, context: Any) -> Any:  # noqa: N802
        update = {key: getattr(value, value.WhichOneof("parameter_choice") or "string_param")
                  for key, value in request.settings.items()}
        response = pb2.LogSettingsResponse()
        for key, value in self.dp.log_settings(update).items():
            field = "bool_param" if isinstance(value, bool) else "uint32_param" if isinstance(value, int) else \
                "string_param"
            setattr(response.settings[key], field, value)
        return response


def _stream_error(message: str, request: Any) -> Any:
    return pb2.ModelStreamInferResponse(error_message=bounded(message), infer_response=pb2.ModelInferResponse(
        id=request.id[:MAX_DETAILS_CHARS]))


class HealthServicer(health_pb2_grpc.HealthServicer):
    """grpc.health.v1.Health: "" answers for the server's readiness, a model name for that model's."""

    def __init__(self, dp: DataPlane):
        self.dp = dp

    async def Check(self, request: Any, context: Any) -> Any:  # noqa: N802
        status = health_pb2.HealthCheckResponse
        if not request.service:
            ready = self.dp.ready()
        elif request.service in self.dp.repository.names_on_disk():
            try:
                ready = self.dp.model_ready(request.service)
            except ServerError:
                ready = False
        else:
            fail(context, grpc.StatusCode.NOT_FOUND, f"unknown service '{request.service}'")
            return None
        return status(status=status.SERVING if ready else status.NOT_SERVING)


# ModelInfer and ModelStreamInfer through grpc_wire: raw tensors neither copied on the way in nor on the way out.
INFER_CODECS = {
    "ModelInfer": Codec(grpc_wire.parse_infer_request, grpc_wire.serialize_response),
    "ModelStreamInfer": Codec(grpc_wire.parse_infer_request, grpc_wire.serialize_stream_response),
}


def add_to_server(server: Any, dp: DataPlane, stream_limits: StreamLimits | None = None, *,
                  max_input_bytes: int = GRPC_MAX_MESSAGE_BYTES, trace_context: bool = False) -> None:
    """GRPCInferenceService and grpc.health.v1.Health over `dp` on `server`, each handler decode-guarded.
    `trace_context`: read requests' traceparent metadata (OpenTelemetry tracing is on)."""
    add_guarded(pb2_grpc.add_GRPCInferenceServiceServicer_to_server,
                InferenceServicer(dp, stream_limits, max_input_bytes, trace_context), server, INFER_CODECS)
    add_guarded(health_pb2_grpc.add_HealthServicer_to_server, HealthServicer(dp), server)
