"""ASGI middleware: the body limit of every route but infer (which has its own, --http-max-input-size). A declared
Content-Length over the limit answers 413 before any of the body is read; a chunked body is counted as it is read,
and the route that reads past the limit gets PayloadTooLargeError (413 through the app's error mapping)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from server.errors import PayloadTooLargeError


@dataclass(frozen=True)
class RouteLimit:
    """A larger limit for the POST routes whose path matches `path` (the load API, which may carry model files)."""

    path: re.Pattern[str]
    limit: int
    flag: str


class BodyLimitMiddleware:
    def __init__(self, app: Any, limit: int, flag: str = "--http-max-body-size", routes: tuple[RouteLimit, ...] = ()):
        self.app, self.limit, self.flag, self.routes = app, limit, flag, routes

    def _limit_of(self, scope: dict[str, Any]) -> tuple[int, str]:
        if scope.get("method") == "POST":
            for route in self.routes:
                if route.path.fullmatch(scope.get("path", "")):
                    return max(route.limit, self.limit), route.flag
        return self.limit, self.flag

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, flag = self._limit_of(scope)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _too_large(send, f"request of {declared} bytes exceeds the {limit}-byte limit ({flag})")
            return
        size = 0

        async def counted() -> dict[str, Any]:
            nonlocal size
            message = await receive()
            size += len(message.get("body", b""))
            if size > limit:
                raise PayloadTooLargeError(f"request exceeds the {limit}-byte limit ({flag})")
            return message

        await self.app(scope, counted, send)


def _content_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # uvicorn's parser refuses such a request before it gets here
    return None


async def _too_large(send: Any, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
