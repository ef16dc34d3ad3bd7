"""uvicorn's httptools protocol, writing each response's head and body in one send, and guarded against slow or
oversized requests and against running out of connections (GuardedHttpToolsProtocol).

uvicorn writes the head when the app sends http.response.start and the body on http.response.body: two send()
calls, two TCP segments and two wake-ups of the client for every small response. An app sends both from the same
coroutine without yielding in between, so the transport here holds a write until the next one (or until the loop's
next turn, for a head with nothing after it) and passes both on in one writelines.

Each request's scope carries its connection's DisconnectWatch (under DISCONNECT_WATCH): the infer fast path registers
its task there and is cancelled when the connection is lost, instead of running a task per request that waits for
http.disconnect.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
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


log = logging.getLogger("nnserve.http")

DISCONNECT_WATCH = "nnserve.disconnect_watch"  # the scope key of a request's DisconnectWatch


class DisconnectWatch:
    """One per connection: the tasks to cancel when it is lost (a request's app task, while it waits for its
    answer), and whether it was."""

    __slots__ = ("lost", "tasks")

    def __init__(self) -> None:
        self.lost = False
        self.tasks: set[asyncio.Task] = set()

    def connection_lost(self) -> None:
        self.lost = True
        for task in self.tasks:
            task.cancel()


@dataclass(frozen=True)
class HttpLimits:
    """What one HTTP connection may hold or take (server/settings.py has the defaults, SECURITY.md the why)."""

    max_header_bytes: int
    header_timeout: float
    body_timeout: float
    idle_timeout: float
    max_connections: int


def protocol_class(limits: HttpLimits) -> type[GuardedHttpToolsProtocol]:
    """uvicorn.Config(http=...) takes a class: one per server, carrying its limits."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})


def _raw_error(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode() + body


class GuardedHttpToolsProtocol(CoalescingHttpToolsProtocol):
    """uvicorn's protocol has a keep-alive timeout between requests and nothing else: a client that connects and
    sends nothing, or half a request, or headers without end, holds a connection (and a file descriptor) forever,
    and enough of them lock everyone out once accept() runs out of descriptors. Here:

    - a connection with no request in progress closes after idle_timeout (from its start, too);
    - a request's line and headers must arrive within header_timeout of its first byte, and be at most
      max_header_bytes (431), else the connection closes;
    - its body must arrive within body_timeout of the headers (408);
    - past max_connections, a new connection closes the one that has been quiet longest (no request running:
      idle, or still sending its headers), or itself when every connection is running a request.
    """

    limits: HttpLimits

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._quiet_since = time.monotonic()
        self._head_bytes = 0  # bytes received since the current request's head began
        self._in_head = True  # the bytes that come next are a request's line and headers
        # One timer handle serves every deadline (see _arm): _deadline/_on_expiry are the current one, if any.
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._deadline = 0.0
        self._on_expiry: Any = None
        self._watch = DisconnectWatch()
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections and not self._evict_one():
            log.warning("HTTP connection limit (%d) reached with every connection busy: refusing one",
                        self.limits.max_connections)
            self.transport.close()
            return
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def _evict_one(self) -> bool:
        quiet = [c for c in self.connections if c is not self and isinstance(c, GuardedHttpToolsProtocol)
                 and c.is_quiet()]
        if not quiet:
            return False
        oldest = min(quiet, key=lambda c: c._quiet_since)
        oldest.transport.close()
        self.connections.discard(oldest)  # closing is asynchronous: it is gone for the count already
        return True

    def is_quiet(self) -> bool:
        """No request of this connection is with the app (idle, or its next request's head still arriving)."""
        return (self.cycle is None or self.cycle.response_complete) and not self.pipeline

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_expiry = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)
        self._watch.connection_lost()  # after uvicorn marked the request disconnected, as receive() would report

    # A request arms a deadline twice (head, then body) and clears it once: a timer scheduled and cancelled for
    # each cost more than the rest of the protocol's work. Arming only moves the deadline; the one handle, when it
    # fires, does nothing (cleared), waits on (moved later) or expires. A new handle is made only for a deadline
    # earlier than the pending one's, or when none is pending: about once per timeout period.
    def _arm(self, seconds: float, on_expiry: Any) -> None:
        deadline = self.loop.time() + seconds
        self._deadline, self._on_expiry = deadline, on_expiry
        if self._timer is None or self._timer_at > deadline:
            self._schedule(deadline)

    def _schedule(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = self.loop.call_at(at, self._fire), at

    def _fire(self) -> None:
        self._timer = None
        if self._on_expiry is None:
            return
        if self.loop.time() + 0.001 < self._deadline:  # moved later since this handle was made (the loop's clock
            # has ms steps: a handle may fire a little before its time, which is no reason to wait on)
            self._schedule(self._deadline)
            return
        on_expiry, self._on_expiry = self._on_expiry, None
        on_expiry()

    def _cancel_timer(self) -> None:
        self._on_expiry = None

    # ---- the head: first byte to the end of the headers ----------------------------------------------------
    # Counted on the raw bytes: httptools accumulates a header's value until the header ends, so a value without
    # end would grow in memory before any callback saw it. A read that ends the headers is not counted against the
    # limit (it may carry the start of the body), so the head may exceed it by one read at most.
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[DISCONNECT_WATCH] = self._watch  # type: ignore[literal-required]
        self._arm(self.limits.header_timeout, self._head_too_slow)

    def data_received(self, data: bytes) -> None:
        if not self._in_head:
            super().data_received(data)
            return
        self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.limits.max_header_bytes and not self.transport.is_closing():
            self._refuse(431, "Request Header Fields Too Large", f"request line and headers exceed "
                         f"{self.limits.max_header_bytes} bytes (--http-max-header-size)")

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()
        self._arm(self.limits.body_timeout, self._body_too_slow)

    def on_message_complete(self) -> None:
        self._cancel_timer()
        self._in_head, self._head_bytes = True, 0  # what comes next is the next request's head
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._quiet_since = time.monotonic()
        super().on_response_complete()

    def _head_too_slow(self) -> None:
        log.debug("closing an HTTP connection whose request headers took over %.1f s", self.limits.header_timeout)
        self.transport.close()

    def _body_too_slow(self) -> None:
        if self.cycle is not None and not self.cycle.response_started:
            self._refuse(408, "Request Timeout", f"request body not received within {self.limits.body_timeout:g} s "
                         "of its headers (--http-body-timeout-secs)")
        else:
            self.transport.close()

    def _refuse(self, status: int, reason: str, message: str) -> None:
        self._cancel_timer()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the app's answer, if it comes, is dropped, not written after this one
        self.transport.write(_raw_error(status, reason, message))
        self.transport.close()
