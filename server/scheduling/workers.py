"""The threads a scheduler runs its instances on: a fixed pool whose idle threads let their kernel threads go.

Each thread that runs an instance on the CPU keeps an OpenMP team of its own (oneDNN's threads), and libgomp
counts every team's threads, idle or not: once they outnumber the CPUs, it cuts every team's spin between ops to
2-3 us, and each op then waits for a sleeping thread to wake (engine.release_thread). A server has such threads
per model (a two-model server on 2 CPUs is over the count even when only one model gets traffic), so a worker
that has had nothing to run for IDLE_RELEASE_S calls `on_idle` (engine.release_thread) on its own thread, and again
before it exits. The next run on it makes a new team (~0.1 ms), once per idle spell.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

import engine

log = logging.getLogger("nnserve")

# Long next to a request's gaps in steady traffic (a team rebuilt per spell costs ~0.1 ms), short enough that a
# model gone quiet stops throttling the busy ones within a second.
IDLE_RELEASE_S = 1.0

_STOP = object()


def release_kernel_threads() -> None:
    """The calling thread's kernel threads go (engine.release_thread); the `on_idle` the schedulers give."""
    engine.release_thread()


class Workers(Executor):
    """`threads` daemon threads named `<name>-N` taking submitted calls in order; `on_idle` runs on a worker after
    `idle_s` without work (once per idle spell) and when it stops."""

    def __init__(self, threads: int, name: str, on_idle: Callable[[], Any] | None = None,
                 idle_s: float = IDLE_RELEASE_S):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._on_idle = on_idle
        self._idle_s = idle_s
        self._shutdown = False
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(max(1, threads))]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new calls after shutdown")
            future: Future = Future()
            self._jobs.put((future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            if not self._shutdown:
                self._shutdown = True
                if cancel_futures:
                    self._cancel_queued()
                for _ in self._threads:
                    self._jobs.put(_STOP)
        if wait:
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join()

    def _cancel_queued(self) -> None:
        kept = []
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is _STOP:
                kept.append(job)
            else:
                job[0].cancel()
        for job in kept:
            self._jobs.put(job)

    def _work(self) -> None:
        idle_done = True  # nothing has run yet: nothing to let go
        while True:
            try:
                job = self._jobs.get(timeout=None if idle_done else self._idle_s)
            except queue.Empty:
                self._idle()
                idle_done = True
                continue
            if job is _STOP:
                self._idle()
                return
            future, fn, args, kwargs = job
            idle_done = False
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # the caller's future carries it, as ThreadPoolExecutor's does
                future.set_exception(exc)
            else:
                future.set_result(result)

    def _idle(self) -> None:
        if self._on_idle is None:
            return
        try:
            self._on_idle()
        except Exception:  # letting threads go is an optimisation: a failure must not stop the worker
            log.exception("releasing an idle worker's kernel threads failed")
