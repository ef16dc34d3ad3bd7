"""GRPCInferenceService over the data plane. ServerErrors map to gRPC status codes in one place (`_guard`)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import json_format

from server.dataplane import GRPC_ENDPOINT, DataPlane
from server.errors import InvalidArgumentError, ServerError
from server.inference import StreamResponse
from server.protocol import grpc_codec
from server.protocol.grpc import health_pb2, health_pb2_grpc, pb2, pb2_grpc

log = logging.getLogger("nnserve.grpc")


def status_of(err: ServerError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, err.grpc_code, grpc.StatusCode.INTERNAL)


def _guard(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """The single ServerError -> gRPC status mapping for every unary rpc."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except ServerError as err:
            await context.abort(status_of(err), err.message)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # a bug: answer INTERNAL with the message, log the traceback
            log.exception("%s failed", method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")

    return wrapper


class InferenceServicer(pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dp: DataPlane):
        self.dp = dp

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
        resp = await self.dp.infer(grpc_codec.decode_request(request), GRPC_ENDPOINT)
        return grpc_codec.encode_response(resp)

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:  # noqa: N802
        """Requests on one stream run concurrently (so they can batch); responses go back as they finish.
        Errors go into error_message and the stream stays open, as Triton does."""
        done: asyncio.Queue[Any] = asyncio.Queue()

        async def read_all() -> None:
            tasks = [asyncio.create_task(self._stream_one(r, done)) async for r in request_iterator]
            await asyncio.gather(*tasks)
            await done.put(None)

        reader = asyncio.create_task(read_all())
        try:
            while (item := await done.get()) is not None:
                yield item
        finally:
            reader.cancel()

    async def _stream_one(self, request: Any, done: asyncio.Queue[Any]) -> None:
        """Every response of one request (a decoupled model's 0..n), each marked triton_final_response as Triton
        marks it; the final flag alone goes out only to a client that asked for it."""
        try:
            req = grpc_codec.decode_request(request)
            empty_final = req.parameters.pop(grpc_codec.EMPTY_FINAL_PARAM, False) is True
            async for item in self.dp.infer_stream(req):
                if item.response is not None or item.error is not None or empty_final:
                    await done.put(grpc_codec.encode_stream_response(item, request))
        except ServerError as err:
            await done.put(grpc_codec.encode_stream_response(StreamResponse(None, err), request))
        except Exception as exc:  # a bug: the stream still answers this request and stays open for the others
            log.exception("ModelStreamInfer request failed")
            await done.put(pb2.ModelStreamInferResponse(error_message=f"internal error: {type(exc).__name__}: {exc}",
                                                        infer_response=pb2.ModelInferResponse(id=request.id)))

    @_guard
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:  # noqa: N802
        rows = self.dp.repository_index(request.ready)
        return json_format.ParseDict({"models": rows}, pb2.RepositoryIndexResponse())

    @_guard
    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:  # noqa: N802
        params = request.parameters
        if any(k.startswith("file:") for k in params):
            raise InvalidArgumentError("loading model files through the API ('file:' parameters) is not supported")
        config = params["config"].string_param if "config" in params else None
        await self.dp.load_model(request.model_name, config)
        return pb2.RepositoryModelLoadResponse()

    @_guard
    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:  # noqa: N802
        await self.dp.unload_model(request.model_name)
        return pb2.RepositoryModelUnloadResponse()


class HealthServicer(health_pb2_grpc.HealthServicer):
    """grpc.health.v1.Health: "" answers for the server's readiness, a model name for that model's."""

    def __init__(self, dp: DataPlane):
        self.dp = dp

    async def Check(self, request: Any, context: Any) -> Any:  # noqa: N802
        status = health_pb2.HealthCheckResponse
        if not request.service:
            ready = self.dp.ready()
        elif request.service in self.dp.repository.names_on_disk():
            ready = self.dp.model_ready(request.service)
        else:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service '{request.service}'")
        return status(status=status.SERVING if ready else status.NOT_SERVING)
