"""Runs requests on a pool of engine instances one request per execution: the scheduler for models without a
dynamic_batching block (Triton's default scheduler). Same submit/start/stop interface as the batching Scheduler.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from server.backend import BackendInstance
from server.errors import UnavailableError


@dataclass
class RunResult:
    outputs: dict[str, np.ndarray]
    queue_ns: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    batch_size: int


def execute(instance: BackendInstance, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int, int, int]:
    """One engine execution with Triton's phase split: (outputs, input_ns, infer_ns, output_ns).

    Nothing is copied here: the instance copies the inputs into its arena and returns caller-owned copies of the
    outputs. The phases are the instance's own copy-in / copy-out times and the rest of the run.
    """
    t0 = time.perf_counter_ns()
    outputs, timings = instance.run_timed(inputs)
    total = time.perf_counter_ns() - t0
    in_ns, out_ns = timings.copy_in_ns, timings.copy_out_ns
    return outputs, in_ns, max(total - in_ns - out_ns, 0), out_ns


def batch_of(inputs: dict[str, np.ndarray]) -> int:
    first = next(iter(inputs.values()), None)
    return int(first.shape[0]) if first is not None and first.ndim > 0 else 1


# A run measured under this goes on the event loop thread next time: handing it to the pool and back (a thread
# wake-up, two GIL hand-offs, the loop's self-pipe) costs more than that. Real models never get near it.
INLINE_MAX_NS = 200_000


class InlinePolicy:
    """Which runs of one instance may go on the event loop thread: inputs no bigger than one already seen running
    under the limit. A bigger request goes to the pool first, where its time is measured. Two runs in a row over the
    limit send their size (and every bigger one) back to the pool until a run of that size is measured cheap again;
    one alone is taken for the machine's noise (a descheduled thread), not the model's cost."""

    STRIKES = 2

    def __init__(self, limit_ns: int = INLINE_MAX_NS):
        self.limit_ns = limit_ns
        self.cheap_bytes = -1  # the largest input size measured cheap; -1: nothing runs inline yet
        self._strikes = 0

    def allows(self, nbytes: int) -> bool:
        return nbytes <= self.cheap_bytes

    def observe(self, nbytes: int, ns: int) -> None:
        if ns <= self.limit_ns:
            self._strikes = 0
            if nbytes > self.cheap_bytes:
                self.cheap_bytes = nbytes
        elif nbytes <= self.cheap_bytes:
            self._strikes += 1
            if self._strikes >= self.STRIKES:
                self.cheap_bytes, self._strikes = nbytes - 1, 0


class DirectRunner:
    """Free instances in front of a thread pool (kernels release the GIL, so instances run in parallel). An idle
    instance is taken at once, and a run its InlinePolicy calls cheap executes right on the event loop thread."""

    def __init__(self, instances: list[Any], *, batching: bool, hooks: Any = None, inline_max_ns: int = INLINE_MAX_NS):
        self._instances = instances
        self._batching = batching
        self._hooks = hooks  # a SchedulerMetrics (server/batching_adapter.VersionMetrics)
        self._policies = {id(inst): InlinePolicy(inline_max_ns) for inst in instances}
        self._waiting = 0
        self._free: asyncio.Queue[Any] | None = None
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(instances)), thread_name_prefix="infer")
        self._inflight = 0
        self._stopping = False
        self._idle = asyncio.Event()
        self.inline_runs = 0  # how many runs went on the loop thread (tests and benches read it)

    async def start(self) -> None:
        self._free = asyncio.Queue()
        for inst in self._instances:
            self._free.put_nowait(inst)
        self._idle.set()

    async def stop(self, drain: bool = True) -> None:
        self._stopping = True
        if drain:
            await self._idle.wait()
        self._pool.shutdown(wait=drain)

    async def submit(self, inputs: dict[str, np.ndarray], *, priority: int = 0,
                     timeout_us: int | None = None) -> RunResult:
        if self._stopping or self._free is None:
            raise UnavailableError("model is being unloaded")
        self._inflight += 1
        self._idle.clear()
        try:
            return await self._run(inputs)
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

    async def _run(self, inputs: dict[str, np.ndarray]) -> RunResult:
        assert self._free is not None
        instance, queue_ns = await self._acquire()
        try:
            policy = self._policies[id(instance)]
            nbytes = sum(a.nbytes for a in inputs.values())
            if policy.allows(nbytes):
                self.inline_runs += 1
                outputs, in_ns, infer_ns, out_ns = execute(instance, inputs)
            else:
                loop = asyncio.get_running_loop()
                outputs, in_ns, infer_ns, out_ns = await loop.run_in_executor(self._pool, execute, instance, inputs)
            policy.observe(nbytes, in_ns + infer_ns + out_ns)
        finally:
            self._free.put_nowait(instance)
        result = RunResult(outputs, queue_ns, in_ns, infer_ns, out_ns, batch_of(inputs) if self._batching else 1)
        if self._hooks:
            self._hooks.on_batch(result.batch_size, 1, result)
        return result

    async def _acquire(self) -> tuple[Any, int]:
        """A free instance and how long the request waited for it (0: one was idle, the queue gauge untouched)."""
        assert self._free is not None
        if not self._waiting:  # with requests already waiting, a newcomer queues behind them
            try:
                return self._free.get_nowait(), 0
            except asyncio.QueueEmpty:
                pass
        t_queue = time.perf_counter_ns()
        self._report_waiting(+1)
        try:
            instance = await self._free.get()
        finally:
            self._report_waiting(-1)
        return instance, time.perf_counter_ns() - t_queue

    def _report_waiting(self, delta: int) -> None:
        self._waiting += delta
        if self._hooks:
            self._hooks.on_queue_depth(self._waiting)
