"""The infer route: body bytes in, body bytes out, over the data plane.

`InferFastPath` serves POST /v2/models/{model}[/versions/{version}]/infer as a plain ASGI endpoint in front of the
FastAPI app: FastAPI's per-request machinery (middleware stack, dependency solving, telemetry hooks, Response
objects) cost more than all the rest of a small model's request. The FastAPI route of the same paths stays for the
OpenAPI schema and for callers that reach the FastAPI app itself; both answer through `infer_answer`, and errors
through `error_answer`, the one ServerError -> HTTP mapping.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from server.dataplane import DataPlane
from server.errors import ClientDisconnectedError, InvalidArgumentError, PayloadTooLargeError, ServerError
from server.inference import InferRequest, InferResponse
from server.protocol import heap, rest_codec
from server.protocol.rest import compression
from server.protocol.rest.transport import DISCONNECT_WATCH, DisconnectWatch
from server.settings import HTTP_DECODE_IN_THREAD_BYTES

log = logging.getLogger("nnserve.http")

JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"
# Starlette's `{model}` matches one path segment: the same paths as the FastAPI routes
INFER_PATH = re.compile(r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")
HEADER_LENGTH = rest_codec.HEADER_LENGTH.lower()
T = TypeVar("T")
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class Answer:
    body: bytes
    status: int = 200
    content_type: str = JSON_TYPE
    headers: dict[str, str] = field(default_factory=dict)

    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"content-type", self.content_type.encode()), (b"content-length", str(len(self.body)).encode()),
                *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items())]


def error_answer(exc: Exception, method: str, path: str) -> Answer:
    """ServerError -> its status and `{"error": message}`; anything else is a bug: 500, logged, no traceback out."""
    if isinstance(exc, ServerError):
        status, message = exc.http_status, exc.message
    else:
        log.exception("%s %s failed", method, path)
        status, message = 500, f"internal error: {type(exc).__name__}: {exc}"
    # as Starlette's JSONResponse renders it
    body = json.dumps({"error": message}, ensure_ascii=False, separators=(",", ":")).encode()
    return Answer(body, status)


async def infer_answer(dp: DataPlane, model: str, version: str, headers: Mapping[str, str], receive: Receive,
                       max_input_bytes: int, decode_in_thread_bytes: int = HTTP_DECODE_IN_THREAD_BYTES,
                       watch: DisconnectWatch | None = None, decode_turn: asyncio.Lock | None = None) -> Answer:
    """One inference request; `headers` is looked up by lower-case name. Bodies of at least
    `decode_in_thread_bytes` are decompressed and decoded in a worker thread (rest_codec.decode_request), one at a
    time when `decode_turn` (the app's) is given. `watch`: the connection's, when the server's protocol gives one
    (else a task per request waits for http.disconnect)."""
    body = await read_body(headers, receive, max_input_bytes)
    arrival = time.perf_counter_ns()  # the whole request is in: its time in the server starts, before decoding
    size = len(body)
    try:
        encoding, header = headers.get("content-encoding"), int_header(headers.get(HEADER_LENGTH))
        if header == 0:
            if encoding and encoding.strip().lower() != "identity":  # a small body may inflate to the limit
                body = await asyncio.to_thread(compression.decompress, body, encoding, max_input_bytes)
            req = _raw_binary(dp, model, version, body)
        elif size >= decode_in_thread_bytes:
            async with decode_turn or contextlib.nullcontext():
                req = await asyncio.to_thread(_decode, model, version, body, encoding, header, max_input_bytes, True)
        else:
            req = _decode(model, version, body, encoding, header, max_input_bytes, False)
        del body  # the request holds what it needs: views of the body for binary tensors, or arrays
        req.max_shm_input_bytes = max_input_bytes  # its shared-memory inputs count like a body's tensors
        req.arrival_ns = arrival
        req.traceparent = headers.get("traceparent", "")  # used in OpenTelemetry tracing only
        work = dp.infer(req)
        resp = await (unless_disconnected(receive, work) if watch is None else unless_lost(watch, work))
        return _encoded(resp, req, headers)
    finally:
        heap.after_request(size)


def _encoded(resp: InferResponse, req: InferRequest, headers: Mapping[str, str]) -> Answer:
    payload, json_len = rest_codec.encode_response(resp, req)
    payload, encoding = compression.compress(payload, headers.get("accept-encoding"))
    answer = Answer(payload, content_type=JSON_TYPE if json_len is None else BINARY_TYPE)
    if encoding:
        answer.headers["Content-Encoding"] = encoding
    if json_len is not None:
        answer.headers[rest_codec.HEADER_LENGTH] = str(json_len)
    return answer


def _decode(model: str, version: str, body: bytes, encoding: str | None, header: int | None, limit: int,
            yielding: bool) -> InferRequest:
    return rest_codec.decode_request(model, version, compression.decompress(body, encoding, limit), header,
                                     yielding=yielding)


def _raw_binary(dp: DataPlane, model: str, version: str, body: bytes) -> InferRequest:
    meta = dp.model_metadata(model, version)
    if len(meta["inputs"]) != 1:
        raise InvalidArgumentError(f"raw binary request (Inference-Header-Content-Length: 0) needs a model with one "
                                   f"input; '{model}' has {len(meta['inputs'])}")
    spec = meta["inputs"][0]
    return rest_codec.raw_binary_request(model, version, body, spec["name"], spec["datatype"], spec["shape"])


async def read_body(headers: Mapping[str, str], receive: Receive, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to be over the limit (before buffering all of it)."""
    declared = int_header(headers.get("content-length"), "Content-Length")
    if declared is not None and declared > limit:
        raise PayloadTooLargeError(f"request of {declared} bytes exceeds the {limit}-byte limit "
                                   "(--http-max-input-size)")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnectedError("client disconnected while sending the request")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"request exceeds the {limit}-byte limit (--http-max-input-size)")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def int_header(value: str | None, name: str = rest_codec.HEADER_LENGTH) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidArgumentError(f"{name} must be an integer, got '{value}'") from None


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client hangs up meanwhile (so a queued request is dropped). Once the body
    is read, the server's next message is http.disconnect: one task waits for it and cancels this one."""
    task = asyncio.current_task()
    assert task is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()
        raise ClientDisconnectedError("client disconnected") from None
    finally:
        watcher.cancel()


async def unless_lost(watch: DisconnectWatch, work: Awaitable[T]) -> T:
    """unless_disconnected for a connection whose protocol cancels the registered task when it is lost."""
    task = asyncio.current_task()
    assert task is not None
    watch.tasks.add(task)
    if watch.lost:  # gone already: the work starts and is cancelled where it first waits, as a watcher task would
        task.cancel()
    try:
        return await work
    except asyncio.CancelledError:
        if not watch.lost:
            raise
        task.uncancel()
        raise ClientDisconnectedError("client disconnected") from None
    finally:
        watch.tasks.discard(task)


class InferFastPath:
    """ASGI: infer requests answered here, everything else passed to `app` (the FastAPI app)."""

    def __init__(self, app: Any, dp: DataPlane, max_input_bytes: int,
                 decode_in_thread_bytes: int = HTTP_DECODE_IN_THREAD_BYTES, decode_turn: asyncio.Lock | None = None):
        self.app, self.dp, self.max_input_bytes = app, dp, max_input_bytes
        self.decode_in_thread_bytes = decode_in_thread_bytes
        self.decode_turn = decode_turn

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        match = INFER_PATH.fullmatch(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if match is None:
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:  # a repeated header: the first one counts, as in Starlette's get()
            headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
        try:
            answer = await infer_answer(self.dp, match["model"], match["version"] or "", headers, receive,
                                        self.max_input_bytes, self.decode_in_thread_bytes,
                                        scope.get(DISCONNECT_WATCH), self.decode_turn)
        except Exception as exc:
            answer = error_answer(exc, "POST", scope["path"])
        await send({"type": "http.response.start", "status": answer.status, "headers": answer.raw_headers()})
        await send({"type": "http.response.body", "body": answer.body})
