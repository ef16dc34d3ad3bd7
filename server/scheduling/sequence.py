"""The sequence batcher of one model version (a sequence_batching block): Triton's scheduler for stateful models.

Each request names its sequence (a correlation id, with START and END flags: server/scheduling/sequence_inputs.py).
A sequence is bound to one slot of one instance for its lifetime, so that its requests run on that instance one at a
time and in arrival order; the decisions (which slot, which requests run together, when an idle sequence is
released) are the pure function sequence_policy.plan(); this class keeps the sequences, applies the plan, adds the
control and state tensors to each request's inputs, and runs executions on worker threads.

A request is refused at once (Triton's messages) when it has no correlation id, when it has more than one row, and
when it continues a sequence that is not open: never started, ended, or released after max_sequence_idle.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from server.backend import BackendInstance, RequestContext, SequenceFlags
from server.errors import InferenceError, InvalidArgumentError, ServerError, UnavailableError
from server.scheduling.execution import Execution, run_batch
from server.scheduling.queue import rows_of
from server.scheduling.scheduler import InferResult, SchedulerMetrics
from server.scheduling.sequence_inputs import (
    Control,
    StateSpec,
    check_correlation_id,
    control_tensors,
    initial_states,
)
from server.scheduling.sequence_policy import SequencePlan, SequencePolicy, SequenceView, plan
from server.scheduling.workers import Workers, release_kernel_threads

log = logging.getLogger("nnserve.sequence")


@dataclass(frozen=True)
class SequenceConfig:
    """A sequence model's scheduling: the policy's knobs, its control inputs and implicit states."""

    model: str
    policy: SequencePolicy
    controls: tuple[Control, ...] = ()
    states: tuple[StateSpec, ...] = ()


@dataclass
class _Request:
    inputs: dict[str, np.ndarray]
    flags: SequenceFlags
    context: RequestContext | None
    future: asyncio.Future[Any]
    enqueue_ns: int


@dataclass
class _Sequence:
    uid: int
    key: int | str
    last_ns: int
    slot: int | None = None
    queue: deque[_Request] = field(default_factory=deque)
    running: bool = False
    ended: bool = False  # its END request arrived: nothing more joins it
    state: dict[str, np.ndarray] | None = None

    def view(self) -> SequenceView:
        head = self.queue[0].enqueue_ns if self.queue else None
        return SequenceView(self.uid, self.slot, head, self.last_ns, self.running)


class SequenceScheduler:
    """Schedules the requests of one sequence model version on its instances."""

    def __init__(self, config: SequenceConfig, instances: Sequence[BackendInstance], *,
                 metrics: SchedulerMetrics | None = None, clock: Callable[[], int] = time.monotonic_ns,
                 executor: Executor | None = None):
        if not instances:
            raise ValueError("SequenceScheduler needs at least one instance")
        self.config = config
        self._instances = list(instances)
        self._batched = config.policy.max_batch_size > 0
        self._metrics = metrics
        self._clock = clock
        self._executor = executor
        self._owns_executor = executor is None
        self._uids = itertools.count()
        self._seqs: dict[int, _Sequence] = {}  # by uid: every sequence holding a slot or waiting for one
        self._open: dict[int | str, _Sequence] = {}  # by correlation id: the sequences a request may continue
        self._busy: set[int] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def queue_depth(self) -> int:
        return sum(len(s.queue) for s in self._seqs.values())

    @property
    def open_sequences(self) -> int:
        return len(self._open)

    async def start(self) -> None:
        if self._loop_task is not None:
            return
        if self._executor is None:
            self._executor = Workers(len(self._instances), "nnserve-sequence", on_idle=release_kernel_threads)
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._loop_task = asyncio.create_task(self._run_loop(), name="nnserve-sequence-batcher")

    async def stop(self, drain: bool = True) -> None:
        """Stop taking requests; with drain, run everything queued first, else fail it. Waits for running
        executions."""
        if self._loop_task is None or self._wake is None:
            return
        self._stopping = True
        if not drain:
            for seq in self._seqs.values():
                while seq.queue:
                    self._fail(seq.queue.popleft(), UnavailableError("Server is shutting down: request dropped "
                                                                     "from the queue"))
        self._wake.set()
        await self._loop_task
        if self._owns_executor and self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    async def submit(self, inputs: dict[str, np.ndarray], *, priority: int = 0, timeout_us: int | None = None,
                     context: RequestContext | None = None) -> InferResult:
        """Queue one request on its sequence and wait for its outputs. `context.sequence` names the sequence."""
        if self._loop_task is None or self._wake is None or self._stopping:
            raise UnavailableError("Model is not serving: its scheduler is stopped")
        request = self._admit(inputs, context)
        self._report_depth()
        self._wake.set()
        try:
            result: InferResult = await request.future
            return result
        except asyncio.CancelledError:
            self._forget(request)
            raise

    def _admit(self, inputs: dict[str, np.ndarray], context: RequestContext | None) -> _Request:
        """Triton's checks, in its order, then the request joins its sequence (a new one for a START)."""
        model = self.config.model
        flags = context.sequence if context is not None else None
        if rows_of(inputs, self._batched) > 1:
            raise InvalidArgumentError(f"inference request to model '{model}' must specify batch-size 1 due to "
                                       "requirements of sequence batcher")
        if flags is None or flags.correlation_id in (0, ""):
            raise InvalidArgumentError(f"inference request to model '{model}' must specify a non-zero or non-empty "
                                       "correlation ID")
        check_correlation_id(self.config.controls, flags.correlation_id, model)
        now = self._clock()
        seq = self._open.get(flags.correlation_id)
        if seq is None and not flags.start:
            raise InvalidArgumentError(f"inference request for sequence {flags.correlation_id} to model '{model}' "
                                       "must specify the START flag on the first request of the sequence")
        if seq is None:
            seq = _Sequence(next(self._uids), flags.correlation_id, now)
            self._seqs[seq.uid] = seq
            self._open[seq.key] = seq
        elif flags.start:
            log.warning("sequence %s for model '%s' has a conflict. The previous sequence did not end before this "
                        "sequence start. Previous sequence will be terminated early.", seq.key, model)
        assert self._loop is not None
        request = _Request(inputs, flags, context, self._loop.create_future(), now)
        seq.queue.append(request)
        seq.last_ns = now
        if flags.end:
            seq.ended = True
            del self._open[seq.key]
        return request

    def _forget(self, request: _Request) -> None:
        """A caller went away: its request leaves its sequence's queue if it is still there."""
        for seq in self._seqs.values():
            if request in seq.queue:
                seq.queue.remove(request)
                if self._metrics:
                    self._metrics.on_request_done("CANCELED", self._clock() - request.enqueue_ns)
                self._report_depth()
                break
        if self._wake is not None:
            self._wake.set()

    # ---- the loop ----------------------------------------------------------------------------------------------
    async def _run_loop(self) -> None:
        try:
            await self._serve()
        except Exception as exc:  # a bug here must not leave callers waiting forever
            self._stopping = True
            for seq in self._seqs.values():
                while seq.queue:
                    self._fail(seq.queue.popleft(), ServerError(f"sequence batcher failed: {exc!r}"))
            raise

    async def _serve(self) -> None:
        assert self._wake is not None
        while True:
            self._wake.clear()
            self._drop_finished()
            now = self._clock()
            free = frozenset(i for i in range(len(self._instances)) if i not in self._busy)
            decision = plan([s.view() for s in self._seqs.values()], now, self.config.policy,
                            num_instances=len(self._instances), free_instances=free)
            self._apply(decision)
            if decision.batches:
                continue
            if self._stopping and not self._busy and not any(s.queue for s in self._seqs.values()):
                return
            await self._sleep(None if decision.wait_until_ns is None else decision.wait_until_ns - now)

    def _drop_finished(self) -> None:
        """Ended sequences with nothing left to run (their END ran, or their last requests were cancelled)."""
        for seq in [s for s in self._seqs.values() if s.ended and not s.queue and not s.running]:
            del self._seqs[seq.uid]

    def _apply(self, decision: SequencePlan) -> None:
        for uid in decision.released:
            seq = self._seqs.pop(cast(int, uid))  # the policy's keys are the uids of _Sequence.view()
            if self._open.get(seq.key) is seq:
                del self._open[seq.key]
            log.debug("sequence %s of model '%s' released after max_sequence_idle", seq.key, self.config.model)
        for uid, slot in decision.bound:
            self._seqs[cast(int, uid)].slot = slot
        for instance, uids in decision.batches:
            self._dispatch(instance, [self._seqs[cast(int, uid)] for uid in uids])

    async def _sleep(self, timeout_ns: int | None) -> None:
        assert self._wake is not None
        if timeout_ns is None:
            await self._wake.wait()
            return
        try:
            await asyncio.wait_for(self._wake.wait(), max(0, timeout_ns) / 1e9)
        except TimeoutError:
            pass

    # ---- executions --------------------------------------------------------------------------------------------
    def _dispatch(self, index: int, seqs: list[_Sequence]) -> None:
        assert self._executor is not None and self._loop is not None
        requests = []
        for seq in seqs:
            seq.running = True
            requests.append(seq.queue.popleft())
        feeds = [self._feed(seq, r) for seq, r in zip(seqs, requests, strict=True)]
        self._busy.add(index)
        self._report_depth()
        contexts = [r.context for r in requests]
        self._executor.submit(self._run_in_worker, self._loop, index, seqs, requests, feeds, contexts)

    def _feed(self, seq: _Sequence, request: _Request) -> dict[str, np.ndarray]:
        """The request's inputs with the control tensors and the sequence's state (reset by a START)."""
        feed = dict(request.inputs)
        feed.update(control_tensors(self.config.controls, request.flags, self._batched))
        if self.config.states:
            start = request.flags.start or seq.state is None
            feed.update(initial_states(self.config.states) if start else seq.state or {})
        return feed

    def _run_in_worker(self, loop: asyncio.AbstractEventLoop, index: int, seqs: list[_Sequence],
                       requests: list[_Request], feeds: list[dict[str, np.ndarray]],
                       contexts: list[RequestContext | None]) -> None:
        started = self._clock()  # the queue ends when the execution starts (Triton's compute start), not at dispatch
        try:
            outcome: Any = run_batch(self._instances[index], feeds, [1] * len(feeds), contexts)
        except Exception as exc:  # handed to the event loop, which fails these requests with it
            outcome = exc
        loop.call_soon_threadsafe(self._finish, index, seqs, requests, started, outcome)

    def _finish(self, index: int, seqs: list[_Sequence], requests: list[_Request], started: int,
                outcome: tuple[list[dict[str, np.ndarray] | Exception], Execution] | Exception) -> None:
        try:
            if isinstance(outcome, Exception):
                for request in requests:
                    self._fail(request, outcome, "BACKEND", started - request.enqueue_ns)
                return
            outputs, execution = outcome
            if self._metrics:
                self._metrics.on_execution(execution)
            for seq, request, out in zip(seqs, requests, outputs, strict=True):
                if not isinstance(out, Exception):
                    out = self._keep_state(seq, out)
                if isinstance(out, Exception):
                    self._fail(request, out, "BACKEND", started - request.enqueue_ns)
                else:
                    self._succeed(request, InferResult(out, started - request.enqueue_ns, execution))
        finally:
            for seq in seqs:
                seq.running = False
            self._busy.discard(index)
            if self._wake is not None:
                self._wake.set()

    def _keep_state(self, seq: _Sequence, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray] | Exception:
        """The state outputs become the sequence's state (fed back on its next request), and leave the response."""
        if not self.config.states:
            return outputs
        outputs = dict(outputs)
        state = {}
        for spec in self.config.states:
            if spec.output_name not in outputs:
                return InferenceError(f"model '{self.config.model}' did not produce the state output "
                                      f"'{spec.output_name}'")
            state[spec.input_name] = np.array(outputs.pop(spec.output_name))
        seq.state = state
        return outputs

    # ---- answers -----------------------------------------------------------------------------------------------
    def _succeed(self, request: _Request, result: InferResult) -> None:
        if self._metrics:
            self._metrics.on_request_done("SUCCESS", result.queue_ns)
        _resolve(request.future, result=result)

    def _fail(self, request: _Request, error: BaseException, reason: str | None = None,
              queue_ns: int | None = None) -> None:
        if self._metrics:
            label = reason or (error.reason if isinstance(error, ServerError) else "OTHER")
            waited = queue_ns if queue_ns is not None else self._clock() - request.enqueue_ns
            self._metrics.on_request_done(label, waited)
        _resolve(request.future, error=error)

    def _report_depth(self) -> None:
        if self._metrics:
            self._metrics.on_queue_depth(self.queue_depth)


def _resolve(future: asyncio.Future[Any], *, result: Any = None, error: BaseException | None = None) -> None:
    if future.done():  # the caller went away while its execution ran
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
