"""Giving freed heap memory back to the operating system after large requests.

grpc reads a message into many small buffers before handing it to Python, and decoding a large JSON body makes
millions of small objects; once freed, glibc keeps that memory in its arenas for reuse instead of returning it, so
a single 256 MiB gRPC message left the server ~200 MiB larger for good. malloc_trim returns it. glibc only:
elsewhere (musl, macOS) there is nothing to call and nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import time

# Requests at least this large trim afterwards; smaller ones leave too little behind to be worth the call.
TRIM_AFTER_BYTES = 2**20
# At most one trim per this many seconds (a trim walks every arena); a large request within it is trimmed after.
TRIM_INTERVAL_SECS = 1.0

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
_malloc_trim = getattr(_libc, "malloc_trim", None)


class _Trimmer:
    def __init__(self) -> None:
        self.last = 0.0  # when the last trim started (monotonic)
        self.pending = False  # one is running or scheduled

    def request(self) -> None:
        if self.pending:
            return
        self.pending = True
        loop = asyncio.get_running_loop()
        wait = self.last + TRIM_INTERVAL_SECS - time.monotonic()
        if wait > 0:
            loop.call_later(wait, self._start, loop)
        else:
            self._start(loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.last = time.monotonic()
        job = loop.run_in_executor(None, _malloc_trim, 0)
        job.add_done_callback(self._done)

    def _done(self, _job: asyncio.Future) -> None:
        self.pending = False


_trimmer = _Trimmer()


def after_request(nbytes: int) -> None:
    """Called once a request of `nbytes` is done with: after a large one the heap's free memory goes back to the OS,
    in a worker thread, at most once per TRIM_INTERVAL_SECS (one that falls within it runs when it is over)."""
    if _malloc_trim is not None and nbytes >= TRIM_AFTER_BYTES:
        _trimmer.request()
