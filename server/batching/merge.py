"""Runs one batch on an engine instance, on a worker thread: concatenate inputs, run, split outputs per request."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from server.backend import BackendInstance
from server.errors import InferenceError


@dataclass
class BatchRun:
    """Outputs per request (in the order of the requests) and where the time went."""

    outputs: list[dict[str, np.ndarray]]
    batch_size: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int


def run_batch(instance: BackendInstance, requests: Sequence[dict[str, np.ndarray]], sizes: Sequence[int],
              clock: Callable[[], int]) -> BatchRun:
    """Run `requests` (with `sizes` rows each) as one batch; a single request goes through unchanged."""
    t0 = clock()
    if len(requests) == 1:
        inputs = {name: np.ascontiguousarray(arr) for name, arr in requests[0].items()}
    else:
        inputs = concat_inputs(requests)
    t1 = clock()
    outputs, _ = instance.run_timed(inputs)
    t2 = clock()
    if len(requests) == 1:
        per_request = [{name: _detached(arr) for name, arr in outputs.items()}]
    else:
        per_request = split_outputs(outputs, sizes)
    t3 = clock()
    return BatchRun(per_request, sum(sizes), t1 - t0, t2 - t1, t3 - t2)


def concat_inputs(requests: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Stack every input along dim 0 (the requests were merged because their names, dtypes and shapes agree)."""
    return {name: np.concatenate([r[name] for r in requests], axis=0) for name in requests[0]}


def split_outputs(outputs: dict[str, Any], sizes: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """Cut every output along dim 0 into `sizes` rows per request; copies, so no caller shares engine memory."""
    total = sum(sizes)
    bounds = np.cumsum([0, *sizes])
    per_request: list[dict[str, np.ndarray]] = [{} for _ in sizes]
    for name, arr in outputs.items():
        arr = np.asarray(arr)
        if arr.ndim == 0 or arr.shape[0] != total:
            raise InferenceError(f"output '{name}' has shape {list(arr.shape)}: cannot split it along dim 0 into "
                                 f"the {len(sizes)} requests of a batch of {total}")
        for i, part in enumerate(per_request):
            part[name] = arr[bounds[i]:bounds[i + 1]].copy()
    return per_request


def _detached(arr: Any) -> np.ndarray:
    # The engine may hand out views of its arena, which the instance's next run overwrites.
    out: np.ndarray = np.asarray(arr)
    return out if out.flags.owndata else out.copy()
