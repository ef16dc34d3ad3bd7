"""Giving freed heap memory back to the operating system after large requests.

grpc reads a message into many small buffers before handing it to Python; once freed, glibc keeps that memory in
its arenas for reuse instead of returning it, so a single 256 MiB message left the server ~200 MiB larger for good.
malloc_trim returns it. glibc only: elsewhere (musl, macOS) there is nothing to call and nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util

# Requests at least this large trim afterwards; smaller ones leave too little behind to be worth the call.
TRIM_AFTER_BYTES = 16 * 2**20

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
_malloc_trim = getattr(_libc, "malloc_trim", None)
_running: set[asyncio.Future] = set()


def after_request(nbytes: int) -> None:
    """Called once a request of `nbytes` is done with: a large one returns the heap's free memory to the OS, in a
    worker thread (a trim walks every arena), one trim at a time."""
    if _malloc_trim is None or nbytes < TRIM_AFTER_BYTES or _running:
        return
    job = asyncio.get_running_loop().run_in_executor(None, _malloc_trim, 0)
    _running.add(job)
    job.add_done_callback(_running.discard)
