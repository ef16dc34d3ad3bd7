"""gRPC server interceptors and the decode guard.

- The decode guard: a message that is not a valid protobuf (truncated, invalid UTF-8 in a string field) answers
  INVALID_ARGUMENT instead of grpc's UNKNOWN plus a traceback in the log. `add_guarded` puts it around each handler
  once, when a servicer is registered; DecodeGuardInterceptor does the same per call, for a server that takes
  handlers some other way (grpc.aio's interceptor path costs more than the rest of a small model's request).
- RestrictedProtocolInterceptor (--grpc-restricted-protocol): Triton answers UNAVAILABLE with
  "This protocol is restricted, expecting header 'triton-grpc-protocol-<key>'" when the metadata is missing or wrong.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from server.protocol import heap
from server.security import GRPC_HEADER_PREFIX, GRPC_METHOD_GROUPS, Restriction, grpc_restricted_message


def _deny_handler(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    async def deny(_request: Any, context: grpc.aio.ServicerContext) -> Any:
        # the code is set, not raised through context.abort: see servicer.fail
        context.set_code(grpc.StatusCode.UNAVAILABLE)
        context.set_details(message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny, handler.request_deserializer, handler.response_serializer)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny, handler.request_deserializer, handler.response_serializer)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny, handler.request_deserializer, handler.response_serializer)
    return grpc.unary_unary_rpc_method_handler(deny, handler.request_deserializer, handler.response_serializer)


class RestrictedProtocolInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, restrictions: dict[str, Restriction]):
        self.restrictions = restrictions

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[grpc.RpcMethodHandler]],
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        group = GRPC_METHOD_GROUPS.get(details.method.rsplit("/", 1)[-1])
        rule = self.restrictions.get(group) if group else None
        if rule is None or handler is None:
            return handler
        header = GRPC_HEADER_PREFIX + rule.key
        presented = next((v for k, v in details.invocation_metadata or () if k == header), None)
        if isinstance(presented, bytes):
            presented = presented.decode("latin-1")
        if rule.allows(presented):
            return handler
        return _deny_handler(handler, grpc_restricted_message(rule.key))


def _malformed(context: grpc.aio.ServicerContext, exc: DecodeError) -> None:
    # the code is set, not raised through context.abort: see servicer.fail
    context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
    context.set_details(f"malformed request message: {exc}")


@dataclass(frozen=True)
class Codec:
    """A method's request deserializer and response serializer, in place of protobuf's for the whole message."""

    deserialize: Callable[[bytes], Any]
    serialize: Callable[[Any], bytes]


def _guard_decoding(handler: grpc.RpcMethodHandler, codec: Codec | None = None) -> grpc.RpcMethodHandler:
    deserialize = codec.deserialize if codec else handler.request_deserializer
    serialize = codec.serialize if codec else handler.response_serializer
    if deserialize is None or handler.response_streaming != handler.request_streaming:
        return handler  # the service has no unary-stream / stream-unary methods
    if not handler.request_streaming:
        inner = handler.unary_unary

        async def unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            try:  # decoded here, not in a wrapper of the deserializer: one coroutine less on every call
                request = deserialize(raw)
            except DecodeError as exc:
                _malformed(context, exc)
                return None
            size = len(raw)
            del raw  # the request holds what it needs of the bytes (views, for a large ModelInfer)
            try:
                return await inner(request, context)
            finally:
                heap.after_request(size)

        return grpc.unary_unary_rpc_method_handler(unary, None, serialize)
    inner_stream = handler.stream_stream

    async def stream(raw_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        async def decoded() -> Any:
            async for raw in raw_iterator:
                try:
                    request = deserialize(raw)
                except DecodeError as exc:  # ends the stream with INVALID_ARGUMENT once the answers so far are out
                    _malformed(context, exc)
                    return
                del raw
                yield request

        async for item in inner_stream(decoded(), context):
            yield item

    return grpc.stream_stream_rpc_method_handler(stream, None, serialize)


def add_guarded(add_servicer: Callable[[Any, Any], None], servicer: Any, server: Any,
                codecs: dict[str, Codec] | None = None) -> None:
    """Registers `servicer` through its generated add_*_to_server with the decode guard around every handler, and
    `codecs` (method name -> Codec) in place of protobuf's for those methods."""
    add_servicer(servicer, _GuardingRegistrar(server, codecs or {}))


class _GuardingRegistrar:
    """What generated add_*_to_server code calls on a server, guarding each handler before passing it on."""

    def __init__(self, server: Any, codecs: dict[str, Codec]):
        self.server = server
        self.codecs = codecs

    def add_generic_rpc_handlers(self, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
        self.server.add_generic_rpc_handlers(tuple(_GuardedGeneric(h, self.codecs) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.server.add_registered_method_handlers(
            service, {name: _guard_decoding(h, self.codecs.get(name)) for name, h in handlers.items()})


class _GuardedGeneric(grpc.GenericRpcHandler):
    """The generic lookup, grpc's fallback to the registered handlers above, guarded the same way."""

    def __init__(self, inner: grpc.GenericRpcHandler, codecs: dict[str, Codec]):
        self.inner = inner
        self.codecs = codecs

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self.inner.service(handler_call_details)
        method = handler_call_details.method.rsplit("/", 1)[-1]
        return None if handler is None else _guard_decoding(handler, self.codecs.get(method))


class DecodeGuardInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation: Callable[[Any], Awaitable[grpc.RpcMethodHandler]],
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        return handler if handler is None else _guard_decoding(handler)
