"""Per model-version statistics for the statistics extension (/stats, ModelStatistics): cumulative and monotonic,
durations in ns, as perf_analyzer reads them to print its server-side breakdown.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")
BATCH_PHASES = ("compute_input", "compute_infer", "compute_output")


@dataclass
class _Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += int(ns)

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class ModelStats:
    """Counters of one model version. Thread-safe: requests finish on many tasks at once."""

    name: str
    version: str
    memory_bytes: int = 0
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    phases: dict[str, _Duration] = field(default_factory=lambda: {p: _Duration() for p in PHASES})
    batches: dict[int, dict[str, _Duration]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record_success(self, *, total_ns: int, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int,
                       batch: int) -> None:
        now_ms = int(time.time() * 1000)
        phases = self.phases
        with self._lock:
            self.last_inference_ms = now_ms
            self.inference_count += batch
            phases["success"].add(total_ns)
            phases["queue"].add(queue_ns)
            phases["compute_input"].add(input_ns)
            phases["compute_infer"].add(infer_ns)
            phases["compute_output"].add(output_ns)

    def record_cache_hit(self, *, total_ns: int, lookup_ns: int) -> None:
        """A request answered from the response cache: a success that ran nothing (Triton counts no inference
        and no execution, and the queue as empty)."""
        now_ms = int(time.time() * 1000)
        with self._lock:
            self.last_inference_ms = now_ms
            self.phases["success"].add(total_ns)
            self.phases["queue"].add(0)
            self.phases["cache_hit"].add(lookup_ns)

    def record_cache_miss(self, miss_ns: int) -> None:
        """The cache's share of a request that ran: its lookup and the insertion of its outputs."""
        with self._lock:
            self.phases["cache_miss"].add(miss_ns)

    def record_failure(self, total_ns: int) -> None:
        with self._lock:
            self.last_inference_ms = int(time.time() * 1000)
            self.phases["fail"].add(total_ns)

    def record_execution(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        with self._lock:
            self.execution_count += 1
            row = self.batches.get(batch_size)
            if row is None:
                row = self.batches[batch_size] = {p: _Duration() for p in BATCH_PHASES}
            row["compute_input"].add(input_ns)
            row["compute_infer"].add(infer_ns)
            row["compute_output"].add(output_ns)

    def as_dict(self) -> dict[str, Any]:
        """The JSON of one entry of `model_stats` (the gRPC message has the same field names)."""
        with self._lock:
            return {
                "name": self.name,
                "version": self.version,
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {p: d.as_dict() for p, d in self.phases.items()},
                "response_stats": {},
                "batch_stats": [
                    {"batch_size": size, **{p: d.as_dict() for p, d in row.items()}}
                    for size, row in sorted(self.batches.items())
                ],
                "memory_usage": [{"type": "CPU", "id": 0, "byte_size": self.memory_bytes}],
            }
