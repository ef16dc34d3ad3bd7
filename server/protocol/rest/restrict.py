"""ASGI middleware for --http-restricted-api: a call to a restricted API group without the configured header answers
403 `{"error": "This API is restricted, expecting header '<key>'"}` (Triton's code and message), before the body is
read.
"""

from __future__ import annotations

import json
from typing import Any

from server.security import Restriction, http_api_group, restricted_message


class RestrictedApiMiddleware:
    def __init__(self, app: Any, restrictions: dict[str, Restriction]):
        self.app = app
        self.restrictions = restrictions

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.restrictions:
            group = http_api_group(scope.get("method", ""), scope.get("path", ""))
            rule = self.restrictions.get(group) if group else None
            if rule is not None:
                presented = _header(scope, rule.key)
                if not rule.allows(presented):
                    await _forbidden(send, restricted_message(rule.key))
                    return
        await self.app(scope, receive, send)


def _header(scope: dict[str, Any], key: str) -> str | None:
    wanted = key.encode("latin-1")
    for name, value in scope.get("headers", ()):
        if name.lower() == wanted:
            return value.decode("latin-1")
    return None


async def _forbidden(send: Any, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
