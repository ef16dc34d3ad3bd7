"""What runs an ensemble's requests: each step as a request to its model through the data plane (so the composing
models schedule, batch and count it as any request: their statistics are their own, as in Triton), a step starting
as soon as the tensors it reads exist. The ensemble's own statistics add its steps' compute phases up, as Triton's
ensemble scheduler does; its queue time is the time before its first step started (nothing queues in front of an
ensemble itself).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

from server.backend import RequestContext
from server.datatypes import numpy_to_wire
from server.ensemble.graph import Step
from server.errors import UnavailableError
from server.inference import InferInput, InferRequest, InferResponse, RequestedOutput
from server.model_calls import ModelCalls
from server.scheduling import Execution, InferResult, SchedulerMetrics
from server.scheduling.queue import rows_of


class EnsembleScheduler:
    def __init__(self, name: str, steps: Sequence[Step], outputs: Sequence[str], batching: bool, calls: ModelCalls,
                 metrics: SchedulerMetrics | None = None):
        self.name, self.steps, self.outputs, self.batching = name, list(steps), list(outputs), batching
        self.calls, self.metrics = calls, metrics
        self._running = False
        self._inflight: set[asyncio.Task[Any]] = set()

    @property
    def queue_depth(self) -> int:
        return 0

    async def start(self) -> None:
        self._running = True

    async def stop(self, drain: bool = True) -> None:
        """Stop taking requests; with drain, the requests under way finish, else they are cancelled."""
        self._running = False
        if not drain:
            for task in self._inflight:
                task.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)

    async def submit(self, inputs: dict[str, np.ndarray], *, priority: int = 0, timeout_us: int | None = None,
                     context: RequestContext | None = None) -> InferResult:
        if not self._running:
            raise UnavailableError("Model is not serving: its scheduler is stopped")
        task = asyncio.current_task()
        assert task is not None
        self._inflight.add(task)
        try:
            return await self._run(inputs, priority, timeout_us, context or RequestContext())
        finally:
            self._inflight.discard(task)

    async def _run(self, inputs: dict[str, np.ndarray], priority: int, timeout_us: int | None,
                   context: RequestContext) -> InferResult:
        tensors = dict(inputs)
        waiting = list(self.steps)
        running: dict[asyncio.Future[tuple[InferResponse, Execution]], Step] = {}
        phases = [0, 0, 0]
        try:
            while waiting or running:
                for step in [s for s in waiting if set(s.input_map.values()) <= tensors.keys()]:
                    waiting.remove(step)
                    request = self._request(step, tensors, priority, timeout_us, context)
                    running[asyncio.ensure_future(self.calls.caller.infer_timed(request))] = step
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    step = running.pop(future)
                    response, execution = future.result()  # a step's error is the ensemble's, as it is
                    produced = {o.name: o.data for o in response.outputs}
                    for model_output, tensor in step.output_map.items():
                        tensors[tensor] = produced[model_output]
                    phases[0] += execution.compute_input_ns
                    phases[1] += execution.compute_infer_ns
                    phases[2] += execution.compute_output_ns
        finally:
            for future in running:
                future.cancel()
        rows = rows_of(inputs, self.batching) if inputs else 1
        execution = Execution(rows, 1, *phases)
        if self.metrics is not None:
            self.metrics.on_execution(execution)
        return InferResult({name: tensors[name] for name in self.outputs}, 0, execution)

    def _request(self, step: Step, tensors: dict[str, np.ndarray], priority: int, timeout_us: int | None,
                 context: RequestContext) -> InferRequest:
        """A step's request: its model's inputs from the ensemble's tensors, its mapped outputs, and the ensemble
        request's id, priority, timeout and parameters (as Triton passes them on)."""
        parameters = dict(context.parameters)
        if priority:
            parameters["priority"] = priority
        if timeout_us:
            parameters["timeout"] = timeout_us
        req = InferRequest(step.model_name, step.model_version, context.request_id, parameters)
        for model_input, tensor in step.input_map.items():
            array = tensors[tensor]
            req.inputs.append(InferInput(model_input, numpy_to_wire(array.dtype), list(array.shape), array))
        req.outputs = [RequestedOutput(name) for name in step.output_map]
        return req
