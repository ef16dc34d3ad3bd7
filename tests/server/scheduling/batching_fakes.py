"""Fake engine instances for the scheduler tests: small numpy functions with a sleep or a gate."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from server.backend import RunTimings


def reference(x: np.ndarray) -> dict[str, np.ndarray]:
    """What every fake computes, row by row: the oracle each caller's rows are checked against."""
    return {"y": x * 2.0 + 1.0, "total": x.reshape(x.shape[0], -1).sum(axis=1)}


class FakeInstance:
    """Runs `reference` after `delay` seconds; optionally waits for `gate` first and raises on a marker row.

    Records every batch it ran and checks that it is never used by two threads at once. Implements what the
    scheduler needs of server.backend.BackendInstance: run_timed."""

    def __init__(self, delay: float = 0.0, gated: bool = False, fail_marker: float | None = None):
        self.delay = delay
        self.gate = threading.Event()
        if not gated:
            self.gate.set()
        self.fail_marker = fail_marker
        self.batches: list[np.ndarray] = []
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def run_timed(self, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], RunTimings]:
        return self.run(inputs), RunTimings(0, 0, 0)  # no copies in or out: the whole run counts as infer

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            self.gate.wait(10)
            time.sleep(self.delay)
            x = inputs["x"]
            self.batches.append(x.copy())
            if self.fail_marker is not None and np.any(x == self.fail_marker):
                raise RuntimeError("kernel failed on marker row")
            return reference(x)
        finally:
            with self._lock:
                self.active -= 1

    @property
    def rows_seen(self) -> list[float]:
        return [float(v) for b in self.batches for v in b.reshape(b.shape[0], -1)[:, 0]]


class RecordingMetrics:
    """A SchedulerMetrics that keeps what it was told."""

    def __init__(self) -> None:
        self.depths: list[int] = []
        self.batches: list[tuple[int, int]] = []
        self.outcomes: list[str] = []

    def on_queue_depth(self, depth: int) -> None:
        self.depths.append(depth)

    def on_execution(self, execution) -> None:
        assert min(execution.compute_infer_ns, execution.compute_input_ns, execution.compute_output_ns) >= 0
        self.batches.append((execution.batch_size, execution.requests))

    def on_request_done(self, outcome: str, queue_ns: int) -> None:
        assert queue_ns >= 0
        self.outcomes.append(outcome)


def rows(value: float, n: int = 1, shape: tuple[int, ...] = (3, 2)) -> dict[str, np.ndarray]:
    """A request of n rows; row i is filled with value + i so every row can be traced back to its request."""
    x = np.stack([np.full(shape, value + i, dtype=np.float32) for i in range(n)])
    return {"x": x}


async def until(condition, timeout: float = 5.0) -> None:
    """Poll `condition` from the event loop (the fakes flip thread-side flags)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.002)


def arun(coro, timeout: float = 30.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))
