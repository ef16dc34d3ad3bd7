"""The threads a scheduler runs its instances on: a fixed pool whose idle threads let their kernel threads go.

Each thread that runs an instance on the CPU keeps an OpenMP team of its own (oneDNN's threads), and libgomp
counts every team's threads, idle or not: once they outnumber the CPUs, it cuts every team's spin between ops to
2-3 us, and each op then waits for a sleeping thread to wake (engine.release_thread). A server has such threads
per model (on 2 CPUs, two models whose workers have both run kernels are over the count even when only one of
them gets traffic now), so a worker that has had nothing to run for IDLE_RELEASE_S calls `on_idle`
(engine.release_thread) on its own thread, and again before it exits; and calls go to the worker idle last, so
that under light traffic a model's other workers go idle too. The next run on a worker that let go makes a new
team (0.4-1 ms), once per idle spell. On Intel's OpenMP (engine/devices/cpu/onednn/binding.py) the release is a
process-wide pause that puts the idle threads to sleep without ending them.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

import engine

log = logging.getLogger("nnserve")

# Long next to a request's gaps in steady traffic (a team rebuilt per spell costs 0.4-1 ms), short enough that a
# model gone quiet stops throttling the busy ones within a second.
IDLE_RELEASE_S = 1.0

MIN_IDLE_S = 0.01

_STOP = object()


def release_kernel_threads() -> bool:
    """The calling thread's kernel threads go (engine.release_thread); the `on_idle` the schedulers give. False:
    they stayed (the engine refused for now: a call from inside a parallel region), to be tried again."""
    return engine.release_thread()


class Workers(Executor):
    """`threads` daemon threads named `<name>-N` running submitted calls in order. A call goes to the worker that
    became idle last (calls wait in a backlog while none is), so light traffic stays on one thread and the others
    go idle: a worker idle for `idle_s` (IDLE_RELEASE_S when not given) calls `on_idle` on its own thread, once per
    idle spell (again after another `idle_s` while it returns False), and once more when it stops."""

    def __init__(self, threads: int, name: str, on_idle: Callable[[], Any] | None = None,
                 idle_s: float | None = None):
        self._on_idle = on_idle
        # a floor: an on_idle that keeps returning False must not become a busy loop
        self._idle_s = max(MIN_IDLE_S, IDLE_RELEASE_S if idle_s is None else idle_s)
        self._shutdown = False
        self._lock = threading.Lock()
        count = max(1, threads)
        self._inboxes: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in range(count)]
        self._idle = list(range(count))[::-1]  # a stack: the last to become idle is taken first (worker 0 first)
        self._backlog: collections.deque[Any] = collections.deque()
        self._threads = [threading.Thread(target=self._work, args=(w,), name=f"{name}-{w}", daemon=True)
                         for w in range(count)]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new calls after shutdown")
            job = (future, fn, args, kwargs)
            if self._idle:
                self._inboxes[self._idle.pop()].put(job)
            else:
                self._backlog.append(job)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            if not self._shutdown:
                self._shutdown = True
                if cancel_futures:
                    while self._backlog:
                        self._backlog.popleft()[0].cancel()
                for inbox in self._inboxes:  # after any job already handed to it, and the backlog (`_next`)
                    inbox.put(_STOP)
        if wait:
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join()

    def _next(self, w: int) -> Any:
        """The next job for worker `w`: the backlog's oldest, else it joins the idle stack (None)."""
        with self._lock:
            if self._backlog:
                return self._backlog.popleft()
            self._idle.append(w)
            return None

    def _work(self, w: int) -> None:
        inbox = self._inboxes[w]
        let_go = True  # nothing has run yet: nothing to let go
        while True:
            try:
                job = inbox.get(timeout=None if let_go else self._idle_s)
            except queue.Empty:
                let_go = self._let_go()  # False: tried again after another idle_s
                continue
            while job is not None:
                if job is _STOP:
                    self._let_go()
                    return
                let_go = False
                job = self._run(w, job)

    def _run(self, w: int, job: tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]) -> Any:
        """Runs `job`, then takes the next one (or goes idle) before answering, so that a caller who submits again
        as soon as it has its answer finds this worker idle (light traffic stays on one thread)."""
        future, fn, args, kwargs = job
        del job  # nothing of a finished call stays referenced by an idle worker (its inputs, its outputs)
        if not future.set_running_or_notify_cancel():
            return self._next(w)
        try:
            result, error = fn(*args, **kwargs), None
        except BaseException as exc:  # the caller's future carries it, as ThreadPoolExecutor's does
            result, error = None, exc
        del fn, args, kwargs
        following = self._next(w)
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
        return following

    def _let_go(self) -> bool:
        if self._on_idle is None:
            return True
        try:
            return self._on_idle() is not False
        except Exception:  # letting threads go is an optimisation: a failure must not stop the worker
            log.exception("releasing an idle worker's kernel threads failed")
            return True
