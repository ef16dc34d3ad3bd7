"""The asyncio loop around the batching policy: queue requests, ask decide() what to run, run batches on free
engine instances in a thread pool (kernels release the GIL), hand each caller its rows."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from server.backend import BackendInstance
from server.batching import population
from server.batching.config import BatchingConfig
from server.batching.merge import BatchRun, run_batch
from server.batching.policy import Pending, decide
from server.batching.queue import Entry, RequestQueue, ResponseOrder, batch_size_of, shape_key
from server.errors import InvalidArgumentError, RequestTimeoutError, ServerError, UnavailableError


@dataclass
class InferResult:
    """One request's outputs and its share of the server-side timings (Triton's statistics fields)."""

    outputs: dict[str, np.ndarray]
    queue_ns: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    batch_size: int  # rows of the batch this request ran in


class SchedulerMetrics(Protocol):
    """What the scheduler reports; the server implements it with prometheus (the engine knows nothing of it)."""

    def on_queue_depth(self, depth: int) -> None:
        """Requests waiting now (nv_inference_pending_request_count)."""

    def on_batch(self, batch_size: int, num_requests: int, run: BatchRun) -> None:
        """One successful execution of `batch_size` rows merged from `num_requests` requests."""

    def on_request_done(self, outcome: str, queue_ns: int) -> None:
        """outcome: "SUCCESS", or a failure reason label: "REJECTED" (timeout), "CANCELED", "BACKEND"."""


class Scheduler:
    """Dynamic batcher for one model version over its engine instances (each used by one thread at a time)."""

    def __init__(self, config: BatchingConfig, instances: list[BackendInstance], *,
                 metrics: SchedulerMetrics | None = None, clock: Callable[[], int] | None = None,
                 executor: Executor | None = None):
        if not instances:
            raise ValueError("Scheduler needs at least one instance")
        self.config = config
        self._free = list(instances)
        self._num_instances = len(instances)
        self._metrics = metrics
        self._clock = clock or time.monotonic_ns
        self._executor = executor
        self._owns_executor = executor is None
        self._queue = RequestQueue(config.max_queue_size)
        self._order = ResponseOrder(config.preserve_ordering)
        self._running: set[asyncio.Task[None]] = set()  # strong references: the loop only keeps weak ones
        self._ids = itertools.count()
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._executing_rows = 0  # for the adaptive wait's estimate
        self._population = population.PeakWindow(population.WINDOW_NS)

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    async def start(self) -> None:
        if self._loop_task is not None:
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(len(self._free), thread_name_prefix="nnserve-batch")
        self._wake = asyncio.Event()
        self._loop_task = asyncio.create_task(self._loop(), name="nnserve-batcher")

    async def stop(self, drain: bool = True) -> None:
        """Stop taking requests; with drain, run everything queued first, else fail it. Waits for running batches."""
        if self._loop_task is None or self._wake is None:
            return
        self._stopping = True
        if not drain:
            for entry in self._queue.take_all():
                self._fail(entry, UnavailableError("Server is shutting down: request dropped from the queue"))
            self._report_depth()
        self._wake.set()
        await self._loop_task
        if self._owns_executor and self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    async def submit(self, inputs: dict[str, np.ndarray], *, priority: int = 0,
                     timeout_us: int | None = None) -> InferResult:
        """Queue one request and wait for its outputs (dim 0 = its own batch)."""
        if self._loop_task is None or self._wake is None or self._stopping:
            raise UnavailableError("Model is not serving: its scheduler is stopped")
        entry = self._make_entry(inputs, priority, timeout_us)
        self._queue.add(entry)
        self._order.register(entry.req_id)
        self._report_depth()
        self._wake.set()
        try:
            result: InferResult = await entry.future
            return result
        except asyncio.CancelledError:
            if self._queue.remove(entry.req_id) is not None:
                self._forget_cancelled(entry)
            raise

    def _make_entry(self, inputs: dict[str, np.ndarray], priority: int, timeout_us: int | None) -> Entry:
        cfg = self.config
        rows = batch_size_of(inputs, cfg.max_batch_size > 0)
        if cfg.max_batch_size and rows > cfg.max_batch_size:
            raise InvalidArgumentError(f"batch size {rows} exceeds the model's max_batch_size {cfg.max_batch_size}")
        now = self._clock()
        timeout = cfg.timeout_of(timeout_us)
        pending = Pending(next(self._ids), rows, shape_key(inputs, cfg.max_batch_size > 0), now,
                          now + timeout * 1000 if timeout else None, cfg.priority_of(priority))
        return Entry(pending, inputs, asyncio.get_running_loop().create_future())

    async def _loop(self) -> None:
        try:
            await self._serve()
        except Exception as exc:  # a bug here must not leave callers waiting forever
            self._stopping = True
            for entry in self._queue.take_all():
                self._fail(entry, ServerError(f"batch scheduler failed: {exc!r}"))
            raise

    async def _serve(self) -> None:
        assert self._wake is not None
        drain_cfg = dataclasses.replace(self.config, max_queue_delay_us=0)
        while True:
            self._wake.clear()  # before deciding: any later event (submit, batch done) wakes the wait below
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
            # Idle instances, not finished tasks: a task leaves `_running` only after its done-callbacks ran.
            if self._stopping and not self._queue and len(self._free) == self._num_instances:
                return
            wake_at = decision.wait_until_ns
            if expected and self._queue:  # the peak may drop as it leaves the window: decide again then
                expiry = self._population.expires_at()  # never None: a sample was taken just above
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

    def _dispatch(self, entries: list[Entry]) -> None:
        self._executing_rows += sum(e.pending.batch_size for e in entries)
        instance = self._free.pop()
        task = asyncio.create_task(self._execute(instance, entries))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        self._report_depth()

    async def _execute(self, instance: BackendInstance, entries: list[Entry]) -> None:
        assert self._wake is not None
        started = self._clock()
        loop = asyncio.get_running_loop()
        try:
            run = await loop.run_in_executor(self._executor, run_batch, instance, [e.inputs for e in entries],
                                             [e.pending.batch_size for e in entries], self._clock)
        except Exception as exc:  # the engine's error fails this batch only; the instance stays in service
            for entry in entries:
                self._fail(entry, exc, "BACKEND", queue_ns=started - entry.pending.enqueue_ns)
        else:
            if self._metrics:
                self._metrics.on_batch(run.batch_size, len(entries), run)
            for entry, outputs in zip(entries, run.outputs, strict=True):
                result = InferResult(outputs, started - entry.pending.enqueue_ns, run.compute_input_ns,
                                     run.compute_infer_ns, run.compute_output_ns, run.batch_size)
                self._succeed(entry, result)
        finally:
            self._observe_population()  # before this batch's rows leave: its clients come back next
            self._executing_rows -= sum(e.pending.batch_size for e in entries)
            self._free.append(instance)
            self._wake.set()

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


def _resolve(future: asyncio.Future[Any], *, result: Any = None, error: BaseException | None = None) -> None:
    if future.done():  # the caller went away while its batch ran
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
