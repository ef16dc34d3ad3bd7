"""All Prometheus metrics of the server, in one place (served on --metrics-port at /metrics).

Triton's names and labels (model, version; reason on failures) are kept exactly, so existing dashboards and HPA
rules work; Triton exposes its cumulative counters without the `_total` suffix prometheus-client would add, so
those are rendered by a small collector. On top: real histograms of request, queue and compute latency, a
batch-size histogram, arena bytes per instance and model load duration.
"""

from __future__ import annotations

import threading
from collections import defaultdict

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import Metric

# Triton's cumulative counters: name -> help.
TRITON_COUNTERS = {
    "nv_inference_request_success": "Number of successful inference requests, all batch sizes",
    "nv_inference_request_failure": "Number of failed inference requests, all batch sizes",
    "nv_inference_count": "Number of inferences performed (a batch of n counts n)",
    "nv_inference_exec_count": "Number of model executions performed",
    "nv_inference_request_duration_us": "Cumulative inference request duration in microseconds",
    "nv_inference_queue_duration_us": "Cumulative inference queuing duration in microseconds",
    "nv_inference_compute_input_duration_us": "Cumulative compute input duration in microseconds",
    "nv_inference_compute_infer_duration_us": "Cumulative compute inference duration in microseconds",
    "nv_inference_compute_output_duration_us": "Cumulative inference compute output duration in microseconds",
}
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class _TritonCounters:
    """Collector for the nv_* counters: exact sample names, no `_total`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)

    def add(self, name: str, labels: dict[str, str], amount: float) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._values[name]
            series[key] = series.get(key, 0.0) + amount

    def value(self, name: str, labels: dict[str, str]) -> float:
        with self._lock:
            return self._values[name].get(tuple(sorted(labels.items())), 0.0)

    def collect(self):  # noqa: ANN201 - prometheus-client's collector protocol
        with self._lock:
            snapshot = {n: dict(s) for n, s in self._values.items()}
        for name, doc in TRITON_COUNTERS.items():
            metric = Metric(name, doc, "counter")
            for key, value in snapshot.get(name, {}).items():
                metric.add_sample(name, dict(key), value)
            yield metric


class ServerMetrics:
    """The metric objects plus the few recording calls the data plane and repository make."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.counters = _TritonCounters()
        self.registry.register(self.counters)
        labels = ["model", "version"]
        self.pending = Gauge("nv_inference_pending_request_count", "Requests queued and not yet executing",
                             labels, registry=self.registry)
        self.load_duration = Gauge("nv_model_load_duration_secs", "Model load time in seconds", labels,
                                   registry=self.registry)
        self.request_hist = Histogram("nnserve_request_duration_seconds", "End-to-end request latency", labels,
                                      buckets=LATENCY_BUCKETS, registry=self.registry)
        self.queue_hist = Histogram("nnserve_queue_duration_seconds", "Time a request waited in the queue", labels,
                                    buckets=LATENCY_BUCKETS, registry=self.registry)
        self.compute_hist = Histogram("nnserve_compute_duration_seconds",
                                      "Compute time (input + infer + output) of a request", labels,
                                      buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_hist = Histogram("nnserve_batch_size", "Batch size of each model execution", labels,
                                    buckets=BATCH_BUCKETS, registry=self.registry)
        self.arena_bytes = Gauge("nnserve_arena_bytes", "Activation arena bytes preallocated per instance",
                                 labels + ["instance"], registry=self.registry)

    def render(self) -> bytes:
        text = generate_latest(self.registry)
        for name in TRITON_COUNTERS:  # the exposition appends `_total` to counter headers; Triton does not
            text = text.replace(f" {name}_total ".encode(), f" {name} ".encode())
        return text

    def request_ok(self, model: str, version: str, *, total_ns: int, queue_ns: int, input_ns: int, infer_ns: int,
                   output_ns: int, batch: int) -> None:
        labels = {"model": model, "version": version}
        add = self.counters.add
        add("nv_inference_request_success", labels, 1)
        add("nv_inference_count", labels, batch)
        add("nv_inference_request_duration_us", labels, total_ns / 1e3)
        add("nv_inference_queue_duration_us", labels, queue_ns / 1e3)
        add("nv_inference_compute_input_duration_us", labels, input_ns / 1e3)
        add("nv_inference_compute_infer_duration_us", labels, infer_ns / 1e3)
        add("nv_inference_compute_output_duration_us", labels, output_ns / 1e3)
        self.request_hist.labels(model, version).observe(total_ns / 1e9)
        self.queue_hist.labels(model, version).observe(queue_ns / 1e9)
        self.compute_hist.labels(model, version).observe((input_ns + infer_ns + output_ns) / 1e9)

    def request_failed(self, model: str, version: str, reason: str, total_ns: int) -> None:
        labels = {"model": model, "version": version}
        self.counters.add("nv_inference_request_failure", {**labels, "reason": reason}, 1)
        self.counters.add("nv_inference_request_duration_us", labels, total_ns / 1e3)

    def execution(self, model: str, version: str, batch_size: int) -> None:
        self.counters.add("nv_inference_exec_count", {"model": model, "version": version}, 1)
        self.batch_hist.labels(model, version).observe(batch_size)

    def model_loaded(self, model: str, version: str, seconds: float, arena_bytes: list[int]) -> None:
        self.load_duration.labels(model, version).set(seconds)
        for i, nbytes in enumerate(arena_bytes):
            self.arena_bytes.labels(model, version, str(i)).set(nbytes)
        for reason in FAILURE_REASONS:  # Triton shows every reason at 0 from the start
            self.counters.add("nv_inference_request_failure", {"model": model, "version": version,
                                                               "reason": reason}, 0)
        for name in TRITON_COUNTERS:
            if name != "nv_inference_request_failure":
                self.counters.add(name, {"model": model, "version": version}, 0)
        self.pending.labels(model, version).set(0)

    def model_unloaded(self, model: str, version: str, instances: int = 0) -> None:
        """Gauges describe what is loaded now, so an unloaded version's series go away (counters stay)."""
        series = [(self.load_duration, (model, version)), (self.pending, (model, version))]
        series += [(self.arena_bytes, (model, version, str(i))) for i in range(instances)]
        for gauge, labels in series:
            try:
                gauge.remove(*labels)
            except KeyError:
                pass
