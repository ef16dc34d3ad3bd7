"""One execution: merge the requests' inputs along dim 0, run an instance, split the outputs per request. It runs on a
worker thread (or, for a run measured cheap, on the event loop thread) and touches nothing of the scheduler."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeGuard

import numpy as np

from server.backend import BackendInstance, RequestContext, RequestsInstance
from server.errors import InferenceError


@dataclass(frozen=True)
class Execution:
    """One run of an instance as the statistics count it (Triton's batch_stats and phases, in ns).

    Attributes:
        batch_size: the rows run together: the sum of its requests' rows.
        requests: how many requests were merged into it.
        compute_input_ns: merging the requests' inputs and the instance copying them in.
        compute_infer_ns: the rest of the instance's run.
        compute_output_ns: the instance copying the outputs out and splitting them per request.
    """

    batch_size: int
    requests: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int

    @property
    def compute_ns(self) -> int:
        return self.compute_input_ns + self.compute_infer_ns + self.compute_output_ns


def run_batch(instance: BackendInstance, requests: Sequence[dict[str, np.ndarray]], rows: Sequence[int],
              contexts: Sequence[RequestContext | None] | None = None
              ) -> tuple[list[dict[str, np.ndarray] | Exception], Execution]:
    """Run `requests` (with `rows` rows each) as one execution: each request's outputs, in order, and its figures.
    A single request goes through unchanged; an instance that takes requests one by one gets them unmerged."""
    if _takes_requests(instance):
        return _run_requests(instance, requests, rows, contexts or [None] * len(requests))
    t0 = time.perf_counter_ns()
    inputs = requests[0] if len(requests) == 1 else concat_inputs(requests)
    t1 = time.perf_counter_ns()
    outputs, timings = instance.run_timed(inputs)
    t2 = time.perf_counter_ns()
    per_request: list[dict[str, np.ndarray] | Exception] = []
    if len(requests) == 1:
        per_request.append({name: _detached(arr) for name, arr in outputs.items()})
    else:
        per_request.extend(split_outputs(outputs, rows))
    t3 = time.perf_counter_ns()
    copy_in, copy_out = timings.copy_in_ns, timings.copy_out_ns
    return per_request, Execution(sum(rows), len(requests), t1 - t0 + copy_in, max(t2 - t1 - copy_in - copy_out, 0),
                                  copy_out + t3 - t2)


_TAKES_REQUESTS: dict[type, bool] = {}


def _takes_requests(instance: BackendInstance) -> TypeGuard[RequestsInstance]:
    """isinstance(instance, RequestsInstance), once per class: a runtime-checkable Protocol's isinstance looks up
    every member of the protocol, each time (several per cent of a small model's request)."""
    kind = type(instance)
    known = _TAKES_REQUESTS.get(kind)
    if known is None:
        known = _TAKES_REQUESTS[kind] = isinstance(instance, RequestsInstance)
    return known


def _run_requests(instance: RequestsInstance, requests: Sequence[dict[str, np.ndarray]], rows: Sequence[int],
                  contexts: Sequence[RequestContext | None]
                  ) -> tuple[list[dict[str, np.ndarray] | Exception], Execution]:
    feed = [(inputs, context or RequestContext()) for inputs, context in zip(requests, contexts, strict=True)]
    outputs, timings = instance.run_requests(feed)
    return outputs, Execution(sum(rows), len(requests), timings.copy_in_ns, timings.compute_ns, timings.copy_out_ns)


def concat_inputs(requests: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Stack every input along dim 0 (the requests were merged because their names, dtypes and shapes agree)."""
    return {name: np.concatenate([r[name] for r in requests], axis=0) for name in requests[0]}


def split_outputs(outputs: dict[str, np.ndarray], rows: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """Cut every output along dim 0 into `rows` rows per request; copies, so no caller shares the instance's
    memory."""
    total = sum(rows)
    bounds = np.cumsum([0, *rows])
    per_request: list[dict[str, np.ndarray]] = [{} for _ in rows]
    for name, arr in outputs.items():
        arr = np.asarray(arr)
        if arr.ndim == 0 or arr.shape[0] != total:
            raise InferenceError(f"output '{name}' has shape {list(arr.shape)}: cannot split it along dim 0 into "
                                 f"the {len(rows)} requests of a batch of {total}")
        for i, part in enumerate(per_request):
            part[name] = arr[bounds[i]:bounds[i + 1]].copy()
    return per_request


def _detached(arr: np.ndarray) -> np.ndarray:
    # A backend may hand out views of its arena, which the instance's next run overwrites.
    out: np.ndarray = np.asarray(arr)
    return out if out.flags.owndata else out.copy()
