"""uvicorn's httptools protocol writing each response's head and body in one send.

uvicorn writes the head when the app sends http.response.start and the body on http.response.body: two send()
calls, two TCP segments and two wake-ups of the client for every small response. An app sends both from the same
coroutine without yielding in between, so the transport here holds a write until the next one (or until the loop's
next turn, for a head with nothing after it) and passes both on in one writelines.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # httptools: the server extra has it


class HeadHoldingTransport:
    """Delegates to `transport`; a write is held until the next write, close, or the loop's next iteration."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._held = data
            self._loop.call_soon(self.flush)
            return
        self._held = None
        self._transport.writelines((held, data))

    def flush(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, pause_reading, set_protocol, ...
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn.Config(http=...): httptools' protocol writing each response's head and body in one send."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(HeadHoldingTransport(transport, self.loop))  # type: ignore[arg-type]
