"""The scheduler of one model version: one request queue, one pool of instances, one set of metrics hooks, and two
policies (SchedulerConfig.dynamic_batching):

- direct, Triton's default scheduler (no dynamic_batching block): each request is one execution. A request that
  finds an instance idle and nobody waiting runs at once, from `submit`; the others wait in the queue and go in
  arrival order as instances free up. A run its instance's InlinePolicy measured cheap executes on the event loop
  thread (handing it to a worker and back would cost more than the run).
- dynamic batching, Triton's dynamic batcher: every request waits in the queue, and the loop asks the pure
  policy.decide() what to run together and when to look again (preferred sizes, max queue delay, priorities,
  timeouts, the adaptive wait); batches run on worker threads (kernels release the GIL).

An instance goes back to the pool in `_finish` only, which runs after the instance's run has returned (on the event
loop thread: right after an inline run, or called from the worker when its run is done). The callers only await
their own futures, so a caller that goes away (a cancelled task) never frees an instance whose run is still going.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from server.backend import BackendInstance, RequestContext
from server.errors import InvalidArgumentError, RequestTimeoutError, ServerError, UnavailableError
from server.scheduling import population
from server.scheduling.config import SchedulerConfig
from server.scheduling.execution import Execution, run_batch
from server.scheduling.inline import INLINE_MAX_NS, InlinePolicy
from server.scheduling.policy import Pending, decide
from server.scheduling.queue import Entry, RequestQueue, ResponseOrder, rows_of, shape_key
from server.scheduling.workers import IDLE_RELEASE_S, Workers, release_kernel_threads

log = logging.getLogger("nnserve")

# What a run gives back to the event loop: each request's outputs (or its own error) and the execution's figures, or
# the error of the whole execution.
Outcome = tuple[list[dict[str, np.ndarray] | Exception], Execution] | Exception


@dataclass(frozen=True)
class InferResult:
    """One request's outputs, how long it waited in the queue, and the execution it ran in."""

    outputs: dict[str, np.ndarray]
    queue_ns: int
    execution: Execution


class SchedulerMetrics(Protocol):
    """What the scheduler reports; the server implements it with its statistics and Prometheus metrics."""

    def on_queue_depth(self, depth: int) -> None:
        """Requests waiting now (nv_inference_pending_request_count)."""

    def on_execution(self, execution: Execution) -> None:
        """One successful execution."""

    def on_request_done(self, outcome: str, queue_ns: int) -> None:
        """outcome: "SUCCESS", or a failure reason label: "REJECTED" (timeout), "CANCELED", "BACKEND"."""


class Scheduler:
    """Schedules the requests of one model version on its instances (each used by one thread at a time)."""

    def __init__(self, config: SchedulerConfig, instances: Sequence[BackendInstance], *,
                 metrics: SchedulerMetrics | None = None, clock: Callable[[], int] = time.monotonic_ns,
                 executor: Executor | None = None, inline_max_ns: int = INLINE_MAX_NS,
                 population_window_ns: int = population.WINDOW_NS):
        if not instances:
            raise ValueError("Scheduler needs at least one instance")
        self.config = config
        self._free = list(instances)
        self._num_instances = len(instances)
        self._metrics = metrics
        self._clock = clock
        self._executor = executor
        self._owns_executor = executor is None
        self._queue = RequestQueue(config.max_queue_size)
        self._order = ResponseOrder(config.preserve_ordering)
        # The direct policy's runs may go on the event loop thread, each instance learning which are cheap.
        inline = config.may_run_inline and not config.dynamic_batching
        self._inline = {id(i): InlinePolicy(inline_max_ns) for i in instances} if inline else {}
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._executing_rows = 0  # for the adaptive wait's estimate
        self._population = population.PeakWindow(population_window_ns)
        self.inline_runs = 0  # how many runs went on the event loop thread (tests and benches read it)
        self._last_inline = 0.0
        self._inline_release: asyncio.TimerHandle | None = None

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    async def start(self) -> None:
        if self._loop_task is not None:
            return
        if self._executor is None:
            self._executor = Workers(self._num_instances, "nnserve-infer", on_idle=release_kernel_threads)
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._loop_task = asyncio.create_task(self._run_loop(), name="nnserve-scheduler")

    async def stop(self, drain: bool = True) -> None:
        """Stop taking requests; with drain, run everything queued first, else fail it. Waits for running
        executions."""
        if self._loop_task is None or self._wake is None:
            return
        self._stopping = True
        if not drain:
            for entry in self._queue.take_all():
                self._fail(entry, UnavailableError("Server is shutting down: request dropped from the queue"))
            self._report_depth()
        self._wake.set()
        await self._loop_task
        if self._inline_release is not None:  # stopped before the idle release: let the loop thread's team go now
            self._inline_release.cancel()
            self._release_inline(now=True)
        if self._owns_executor and self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    async def submit(self, inputs: dict[str, np.ndarray], *, priority: int = 0, timeout_us: int | None = None,
                     context: RequestContext | None = None) -> InferResult:
        """Schedule one request and wait for its outputs (dim 0 = its own rows). `context` reaches instances that
        take requests one by one (RequestsInstance); others never see it."""
        if self._loop_task is None or self._wake is None or self._stopping:
            raise UnavailableError("Model is not serving: its scheduler is stopped")
        entry = self._make_entry(inputs, priority, timeout_us)
        entry.context = context
        self._queue.add(entry)
        self._order.register(entry.req_id)
        if not self.config.dynamic_batching and len(self._queue) == 1 and self._free:
            self._dispatch(self._queue.take((entry.req_id,)), waited=False)
        else:
            self._report_depth()
            self._wake.set()
        try:
            result: InferResult = await entry.future
            return result
        except asyncio.CancelledError:
            if self._queue.remove(entry.req_id) is not None:
                self._forget_cancelled(entry)
            elif context is not None:  # already running: a backend that can stop early is told (Cancellation)
                context.cancellation.cancel()
            raise

    def _make_entry(self, inputs: dict[str, np.ndarray], priority: int, timeout_us: int | None) -> Entry:
        cfg = self.config
        rows = rows_of(inputs, cfg.max_batch_size > 0)
        if cfg.max_batch_size and rows > cfg.max_batch_size:
            raise InvalidArgumentError(f"batch size {rows} exceeds the model's max_batch_size {cfg.max_batch_size}")
        now = self._clock()
        timeout = cfg.timeout_of(timeout_us)
        pending = Pending(next(self._ids), rows, shape_key(inputs, cfg.max_batch_size > 0), now,
                          now + timeout * 1000 if timeout else None, cfg.priority_of(priority))
        return Entry(pending, inputs, asyncio.get_running_loop().create_future())

    # ---- the loop: what waits in the queue -------------------------------------------------------------------
    async def _run_loop(self) -> None:
        try:
            await self._serve()
        except Exception as exc:  # a bug here must not leave callers waiting forever
            self._stopping = True
            for entry in self._queue.take_all():
                self._fail(entry, ServerError(f"scheduler failed: {exc!r}"))
            raise

    async def _serve(self) -> None:
        assert self._wake is not None
        drain_cfg = dataclasses.replace(self.config, max_queue_delay_us=0)
        while True:
            self._wake.clear()  # before deciding: any later event (submit, execution done) wakes the wait below
            for entry in self._queue.drop_cancelled():
                self._forget_cancelled(entry)
            now = self._clock()
            cfg = drain_cfg if self._stopping else self.config
            expected = 0
            if cfg.wait_policy == "adaptive":  # the rows in the server now count too, however old their arrival
                self._observe_population(now)
                expected = self._population.peak(now)
            decision = decide(self._queue.pending(), now, cfg, free_instances=len(self._free), expected_rows=expected)
            for req_id in decision.expired:
                self._expire(self._queue.remove(req_id))
            if decision.batch:
                self._dispatch(self._queue.take(decision.batch))
                continue
            if decision.expired:
                self._report_depth()
            if self._stopping and not self._queue and len(self._free) == self._num_instances:
                return
            wake_at = decision.wait_until_ns
            expiry = self._population.expires_at() if expected and self._queue else None
            if expiry is not None:  # the peak may drop as it leaves the window: decide again then
                wake_at = expiry if wake_at is None else min(wake_at, expiry)
            await self._sleep(None if wake_at is None else wake_at - now)

    async def _sleep(self, timeout_ns: int | None) -> None:
        """Wait for the next event, or at most `timeout_ns` (a batch delay ending, a deadline passing)."""
        assert self._wake is not None
        if timeout_ns is None:
            await self._wake.wait()
            return
        try:
            await asyncio.wait_for(self._wake.wait(), max(0, timeout_ns) / 1e9)
        except TimeoutError:
            pass

    def _observe_population(self, now_ns: int | None = None) -> None:
        """Samples the rows in the server (queued and executing) for the adaptive wait; only that policy reads it."""
        if self.config.wait_policy == "adaptive":
            now = self._clock() if now_ns is None else now_ns
            self._population.observe(now, self._queue.rows + self._executing_rows)

    # ---- executions ------------------------------------------------------------------------------------------
    def _dispatch(self, entries: list[Entry], waited: bool = True) -> None:
        """Run `entries` as one execution on a free instance: inline when its policy allows, else on a worker.
        `waited` False: a request that found an instance idle at once (the queue depth unchanged; run inline, no queue
        time; on a worker, its queue time is the hand-over to the worker)."""
        assert self._executor is not None and self._loop is not None
        instance = self._free.pop()
        rows = [e.pending.rows for e in entries]
        self._executing_rows += sum(rows)
        if waited:
            self._report_depth()
        inline = self._inline.get(id(instance))
        if inline is not None and inline.allows(_input_bytes(entries)):
            self.inline_runs += 1
            started = self._clock() if waited else entries[0].pending.enqueue_ns
            self._finish(instance, entries, started, _attempt(instance, entries, rows))
            self._inline_ran()
        else:
            self._executor.submit(self._run_in_worker, self._loop, instance, entries, rows)

    def _inline_ran(self) -> None:
        """An inline run may have given the event loop thread a team of kernel threads (workers.py): it goes once
        this scheduler has run nothing inline for IDLE_RELEASE_S (never during a run: the loop runs one thing at a
        time)."""
        self._last_inline = time.monotonic()
        if self._inline_release is None and self._loop is not None:
            self._inline_release = self._loop.call_later(IDLE_RELEASE_S, self._release_inline)

    def _release_inline(self, now: bool = False) -> None:
        assert self._loop is not None
        left = self._last_inline + IDLE_RELEASE_S - time.monotonic()
        if left > 0 and not now:
            self._inline_release = self._loop.call_later(left, self._release_inline)
            return
        self._inline_release = None
        try:
            released = release_kernel_threads()
        except Exception:  # an optimisation: a failure must not reach the event loop
            log.exception("releasing the event loop thread's kernel threads failed")
            return
        if not released and not now:  # the engine refused for now: try again later
            self._inline_release = self._loop.call_later(IDLE_RELEASE_S, self._release_inline)

    def _run_in_worker(self, loop: asyncio.AbstractEventLoop, instance: BackendInstance, entries: list[Entry],
                       rows: list[int]) -> None:
        # The queue ends when the execution starts (Triton's compute start): the hand-over to this thread counts.
        started = self._clock()
        outcome = _attempt(instance, entries, rows)
        loop.call_soon_threadsafe(self._finish, instance, entries, started, outcome)

    def _finish(self, instance: BackendInstance, entries: list[Entry], started: int, outcome: Outcome) -> None:
        """On the event loop thread, after the instance's run returned: answer the callers, free the instance."""
        try:
            if isinstance(outcome, Exception):  # the backend's error fails this execution only
                for entry in entries:
                    self._fail(entry, outcome, "BACKEND", queue_ns=started - entry.pending.enqueue_ns)
                return
            outputs, execution = outcome
            inline = self._inline.get(id(instance))
            if inline is not None:
                inline.observe(_input_bytes(entries), execution.compute_ns)
            if self._metrics:
                self._metrics.on_execution(execution)
            for entry, out in zip(entries, outputs, strict=True):
                queue_ns = started - entry.pending.enqueue_ns
                if isinstance(out, Exception):  # a backend that fails one request of a batch alone
                    self._fail(entry, out, "BACKEND", queue_ns=queue_ns)
                else:
                    self._succeed(entry, InferResult(out, queue_ns, execution))
        finally:
            self._observe_population()  # before this execution's rows leave: its clients come back next
            self._executing_rows -= sum(e.pending.rows for e in entries)
            self._free.append(instance)
            if self._wake is not None and (self._queue or self._stopping):
                self._wake.set()

    # ---- answers ---------------------------------------------------------------------------------------------
    def _succeed(self, entry: Entry, result: InferResult) -> None:
        if self._metrics:
            self._metrics.on_request_done("SUCCESS", result.queue_ns)
        self._order.deliver(entry.req_id, lambda: _resolve(entry.future, result=result))

    def _fail(self, entry: Entry, error: BaseException, reason: str | None = None, queue_ns: int | None = None) -> None:
        if self._metrics:
            label = reason or (error.reason if isinstance(error, ServerError) else "OTHER")
            self._metrics.on_request_done(label, queue_ns if queue_ns is not None else self._waited(entry))
        self._order.deliver(entry.req_id, lambda: _resolve(entry.future, error=error))

    def _expire(self, entry: Entry | None) -> None:
        if entry is not None:
            self._fail(entry, RequestTimeoutError())

    def _forget_cancelled(self, entry: Entry) -> None:
        self._order.drop(entry.req_id)
        if self._metrics:
            self._metrics.on_request_done("CANCELED", self._waited(entry))
        self._report_depth()
        if self._wake is not None:
            self._wake.set()

    def _waited(self, entry: Entry) -> int:
        return self._clock() - entry.pending.enqueue_ns

    def _report_depth(self) -> None:
        if self._metrics:
            self._metrics.on_queue_depth(len(self._queue))


def _attempt(instance: BackendInstance, entries: list[Entry], rows: list[int]) -> Outcome:
    try:
        return run_batch(instance, [e.inputs for e in entries], rows, [e.context for e in entries])
    except Exception as exc:  # handed to the event loop, which fails these requests with it
        return exc


def _input_bytes(entries: list[Entry]) -> int:
    return sum(a.nbytes for e in entries for a in e.inputs.values())


def _resolve(future: asyncio.Future[Any], *, result: Any = None, error: BaseException | None = None) -> None:
    if future.done():  # the caller went away while its execution ran
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
