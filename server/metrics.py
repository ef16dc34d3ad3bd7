"""All Prometheus metrics of the server, in one place (served on --metrics-port at /metrics).

Triton's names and labels (model, version; reason on failures) are kept exactly, so existing dashboards and HPA
rules work; Triton exposes its cumulative counters without the `_total` suffix prometheus-client would add, so
those are rendered by a small collector. On top: real histograms (server/histograms.py) of request, queue and
compute latency, a batch-size histogram, arena bytes per instance (labelled with its device, "cpu" or "cuda:N"),
device memory per instance and per GPU, and model load duration. Like Triton, the machine's CPU utilisation and
memory (nv_cpu_*), and prometheus-client's process_* (CPU seconds, resident memory, open fds, start time).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, ProcessCollector, generate_latest
from prometheus_client.core import Metric

from server.backend import BackendInstance
from server.histograms import Histograms

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
# Triton's response cache counters, per model that caches (durations in microseconds).
CACHE_COUNTERS = {
    "nv_cache_num_hits_per_model": "Number of cache hits per model",
    "nv_cache_hit_duration_per_model": "Total cache hit duration per model, in microseconds",
    "nv_cache_num_misses_per_model": "Number of cache misses per model",
    "nv_cache_miss_duration_per_model": "Total cache miss (insert+lookup) duration per model, in microseconds",
}
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
# Unloaded versions remembered so that a request finishing after the unload records nothing (ServerMetrics._retired):
# the oldest are forgotten past this many, so a client that loads and unloads ever new model names (uploads, explicit
# control) cannot grow the set without bound. A request would have to outlast this many later unloads to bring a
# forgotten version's series back.
MAX_RETIRED = 4096
# name, help, buckets; _hot_series relies on this order
HISTOGRAMS = (
    ("nnserve_request_duration_seconds", "End-to-end request latency", LATENCY_BUCKETS),
    ("nnserve_queue_duration_seconds", "Time a request waited in the queue", LATENCY_BUCKETS),
    ("nnserve_compute_duration_seconds", "Compute time (input + infer + output) of a request", LATENCY_BUCKETS),
    ("nnserve_batch_size", "Batch size of each model execution", BATCH_BUCKETS),
)
class _TritonCounters:
    """Collector for the nv_* counters: exact sample names, no `_total`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)

    def add(self, name: str, labels: dict[str, str], amount: float) -> None:
        self.add_all(tuple(sorted(labels.items())), {name: amount})

    def add_all(self, key: tuple[tuple[str, str], ...], amounts: dict[str, float]) -> None:
        """Several counters of one series key (sorted label items) under one lock: a request's whole update."""
        with self._lock:
            for name, amount in amounts.items():
                series = self._values[name]
                series[key] = series.get(key, 0.0) + amount

    def remove(self, model: str, version: str) -> None:
        """Every series of (model, version), whatever its other labels (the failures' reason)."""
        wanted = {("model", model), ("version", version)}
        with self._lock:
            for series in self._values.values():
                for key in [k for k in series if wanted <= set(k)]:
                    del series[key]

    def value(self, name: str, labels: dict[str, str]) -> float:
        with self._lock:
            return self._values[name].get(tuple(sorted(labels.items())), 0.0)

    def collect(self):  # noqa: ANN201 - prometheus-client's collector protocol
        with self._lock:
            snapshot = {n: dict(s) for n, s in self._values.items()}
        for name, doc in (TRITON_COUNTERS | CACHE_COUNTERS).items():
            metric = Metric(name, doc, "counter")
            for key, value in snapshot.get(name, {}).items():
                metric.add_sample(name, dict(key), value)
            yield metric


class _DeviceMemory:
    """nnserve_device_memory_{used,total}_bytes{device}: the driver's figures for each device that has loaded
    instances, read at scrape time (devices without such figures, the CPU and the CUDA simulator, are left out)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.instances: dict[tuple[str, str], list[BackendInstance]] = {}  # (model, version) -> its instances

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            by_name = {i.device_name: i for instances in self.instances.values() for i in instances}
        used = Metric("nnserve_device_memory_used_bytes", "Device memory in use (whole device, from the driver)",
                      "gauge")
        total = Metric("nnserve_device_memory_total_bytes", "Device memory size (from the driver)", "gauge")
        for name, instance in sorted(by_name.items()):
            figures = _device_memory(instance)
            if figures is not None:
                used.add_sample(used.name, {"device": name}, figures[0])
                total.add_sample(total.name, {"device": name}, figures[1])
        yield used
        yield total


def _device_memory(instance: BackendInstance) -> tuple[int, int] | None:
    try:
        return instance.device_memory()
    except Exception:  # a scrape must not fail because a driver query did
        return None


class _CpuMetrics:
    """Triton's CPU metrics, read from /proc at scrape time: nv_cpu_utilization (busy share of all the machine's
    CPUs since the previous scrape, [0, 1]; the first scrape covers the time since start-up) and
    nv_cpu_memory_{total,used}_bytes (MemTotal and MemTotal - MemAvailable of /proc/meminfo). As in Triton these
    describe the machine (in a container: the node), not the process; process_* describes the process. Where /proc
    cannot be read (not Linux) the samples are left out rather than reported as 0."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._lock = threading.Lock()
        self._last = self._cpu_times()
        self._utilization: float | None = None

    def _cpu_times(self) -> tuple[int, int] | None:
        """(busy, idle) jiffies of the aggregate `cpu` line of /proc/stat, counted as Triton counts them."""
        try:
            with open(self._proc / "stat", encoding="ascii") as f:
                fields = f.readline().split()
        except OSError:
            return None
        if not fields or fields[0] != "cpu" or len(fields) < 9:
            return None
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
        return user + nice + system + irq + softirq + steal, idle + iowait

    def utilization(self) -> float | None:
        with self._lock:
            now = self._cpu_times()
            if now is None or self._last is None:
                self._last = now
                return None
            busy, idle = now[0] - self._last[0], now[1] - self._last[1]
            if busy < 0 or idle < 0:  # counters went back (another /proc, a wrapped counter): start afresh
                self._last = now
                return self._utilization
            if busy + idle > 0:  # scrapes within one clock tick keep the previous figure
                self._utilization = busy / (busy + idle)
                self._last = now
            return self._utilization

    def memory(self) -> tuple[int, int] | None:
        """(total, used) bytes; used = MemTotal - MemAvailable, Triton's definition."""
        found = {}
        try:
            with open(self._proc / "meminfo", encoding="ascii") as f:
                for line in f:
                    key, _, rest = line.partition(":")
                    if key in ("MemTotal", "MemAvailable"):
                        found[key] = int(rest.split()[0]) * 1024  # the file says kB and means KiB
        except (OSError, ValueError, IndexError):
            return None
        if len(found) < 2 or found["MemAvailable"] > found["MemTotal"]:
            return None
        return found["MemTotal"], found["MemTotal"] - found["MemAvailable"]

    def collect(self):  # noqa: ANN201 - prometheus-client's collector protocol
        util = Metric("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", "gauge")
        total = Metric("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", "gauge")
        used = Metric("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", "gauge")
        share = self.utilization()
        if share is not None:
            util.add_sample(util.name, {}, share)
        memory = self.memory()
        if memory is not None:
            total.add_sample(total.name, {}, memory[0])
            used.add_sample(used.name, {}, memory[1])
        yield util
        yield total
        yield used


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
        self.histograms = Histograms()
        for name, doc, buckets in HISTOGRAMS:
            self.histograms.family(name, doc, buckets)
        self.registry.register(self.histograms)
        instance_labels = labels + ["instance", "device"]
        self.arena_bytes = Gauge("nnserve_arena_bytes",
                                 "Activation memory (arena + workspace) preallocated per instance, on its device",
                                 instance_labels, registry=self.registry)
        self.instance_memory = Gauge("nnserve_instance_device_memory_bytes",
                                     "Device memory one GPU instance allocated: arena, workspace and its weights",
                                     instance_labels, registry=self.registry)
        self.device_memory = _DeviceMemory()
        self.registry.register(self.device_memory)
        self.cpu = _CpuMetrics()
        self.registry.register(self.cpu)
        ProcessCollector(registry=self.registry)  # process_*: CPU seconds, memory, fds, start time of this process
        # Per loaded (model, version): how many loads hold it (a reload loads the new copy before the old one is
        # retired) and the instance series it set, so the old copy's retirement removes nothing of the new one.
        self._loads: dict[tuple[str, str], int] = defaultdict(int)
        self._series: dict[tuple[str, str], set[tuple[Gauge, tuple[str, ...]]]] = {}
        self._placed: dict[tuple[str, str], list[BackendInstance]] = {}
        # Per (model, version): the counters' series key and the histogram series, looked up once instead of on
        # every request (dropped with the series when the version is unloaded).
        self._hot: dict[tuple[str, str], tuple[Any, ...]] = {}
        # The versions unloaded and not loaded since: what they still report is dropped
        self._retired: OrderedDict[tuple[str, str], None] = OrderedDict()  # oldest first, MAX_RETIRED at most

    def render(self) -> bytes:
        text = generate_latest(self.registry)
        for name in TRITON_COUNTERS | CACHE_COUNTERS:  # the exposition appends `_total` to headers; Triton does not
            text = text.replace(f" {name}_total ".encode(), f" {name} ".encode())
        return text

    def _hot_series(self, model: str, version: str) -> tuple[Any, ...]:
        hot = self._hot.get((model, version))
        if hot is None:
            hot = (tuple(sorted({"model": model, "version": version}.items())),
                   *(self.histograms.series(name, model, version) for name, _, _ in HISTOGRAMS))
            self._hot[(model, version)] = hot
        return hot

    def request_ok(self, model: str, version: str, *, total_ns: int, queue_ns: int, input_ns: int, infer_ns: int,
                   output_ns: int, batch: int) -> None:
        if (model, version) in self._retired:
            return
        key, request_hist, queue_hist, compute_hist, _ = self._hot_series(model, version)
        # Triton adds each request's durations in whole microseconds (ns // 1000), from the same figures as /stats
        self.counters.add_all(key, {
            "nv_inference_request_success": 1,
            "nv_inference_count": batch,
            "nv_inference_request_duration_us": total_ns // 1000,
            "nv_inference_queue_duration_us": queue_ns // 1000,
            "nv_inference_compute_input_duration_us": input_ns // 1000,
            "nv_inference_compute_infer_duration_us": infer_ns // 1000,
            "nv_inference_compute_output_duration_us": output_ns // 1000,
        })
        self.histograms.observe((request_hist, total_ns / 1e9), (queue_hist, queue_ns / 1e9),
                                (compute_hist, (input_ns + infer_ns + output_ns) / 1e9))

    def cache_hit(self, model: str, version: str, *, total_ns: int, lookup_ns: int) -> None:
        """Triton's accounting of a response cache hit: a success, with its time and no inference or queue time."""
        if (model, version) in self._retired:
            return
        key, request_hist, queue_hist, _, _ = self._hot_series(model, version)
        self.counters.add_all(key, {
            "nv_inference_request_success": 1,
            "nv_inference_request_duration_us": total_ns // 1000,
            "nv_cache_num_hits_per_model": 1,
            "nv_cache_hit_duration_per_model": lookup_ns // 1000,
        })
        self.histograms.observe((request_hist, total_ns / 1e9), (queue_hist, 0.0))

    def cache_miss(self, model: str, version: str, *, miss_ns: int) -> None:
        if (model, version) in self._retired:
            return
        key = self._hot_series(model, version)[0]
        self.counters.add_all(key, {"nv_cache_num_misses_per_model": 1,
                                    "nv_cache_miss_duration_per_model": miss_ns // 1000})

    def request_failed(self, model: str, version: str, reason: str, total_ns: int) -> None:
        """A failure counts under its reason only: as in Triton, nv_inference_request_duration_us adds up the
        successes (a failure's duration is in the statistics' `fail`)."""
        if (model, version) in self._retired:
            return
        labels = {"model": model, "version": version}
        self.counters.add("nv_inference_request_failure", {**labels, "reason": reason}, 1)

    def execution(self, model: str, version: str, batch_size: int) -> None:
        if (model, version) in self._retired:
            return
        key, *_, batch_hist = self._hot_series(model, version)
        self.counters.add_all(key, {"nv_inference_exec_count": 1})
        self.histograms.observe((batch_hist, batch_size))

    def instances_placed(self, model: str, version: str, instances: Sequence[BackendInstance]) -> None:
        """The instances of a version being loaded (their devices label the series); model_loaded follows."""
        self._placed[(model, version)] = list(instances)

    def model_loaded(self, model: str, version: str, seconds: float, arena_bytes: list[int]) -> None:
        key = (model, version)
        self._loads[key] += 1
        self._retired.pop(key, None)
        self.load_duration.labels(model, version).set(seconds)
        self._set_instance_series(key, arena_bytes, self._placed.pop(key, []))
        for reason in FAILURE_REASONS:  # Triton shows every reason at 0 from the start
            self.counters.add("nv_inference_request_failure", {"model": model, "version": version,
                                                               "reason": reason}, 0)
        for name in TRITON_COUNTERS:
            if name != "nv_inference_request_failure":
                self.counters.add(name, {"model": model, "version": version}, 0)
        self.pending.labels(model, version).set(0)

    def _set_instance_series(self, key: tuple[str, str], arena_bytes: list[int],
                             instances: list[BackendInstance]) -> None:
        series = set()
        for i, nbytes in enumerate(arena_bytes):
            instance = instances[i] if i < len(instances) else None
            labels = (*key, str(i), instance.device_name if instance is not None else "cpu")
            self.arena_bytes.labels(*labels).set(nbytes)
            series.add((self.arena_bytes, labels))
            used = instance.device_memory_bytes if instance is not None else None  # devices with their own memory
            if used is not None:
                self.instance_memory.labels(*labels).set(used)
                series.add((self.instance_memory, labels))
        for gauge, labels in self._series.get(key, set()) - series:  # a reload with fewer instances
            _remove(gauge, labels)
        self._series[key] = series
        with self.device_memory._lock:
            self.device_memory.instances[key] = list(instances)

    def model_unloaded(self, model: str, version: str, instances: int = 0) -> None:
        """As in Triton (a model's metric reporter removes its series when the model goes), an unloaded version's
        series go away: gauges, counters and histograms; loaded again, it starts from 0. During a reload the new
        copy is loaded first: retiring the old one then leaves the series in place. A request that was under way
        and finishes after the unload records nothing (it would bring the series back). `instances` is kept for
        callers; the gauges removed are the ones model_loaded recorded."""
        key = (model, version)
        self._loads[key] = max(self._loads[key] - 1, 0)
        if self._loads[key]:
            return
        del self._loads[key]
        self._retired[key] = None
        self._retired.move_to_end(key)
        while len(self._retired) > MAX_RETIRED:
            self._retired.popitem(last=False)
        series = {(self.load_duration, key), (self.pending, key)} | self._series.pop(key, set())
        for gauge, labels in series:
            _remove(gauge, labels)
        self.counters.remove(model, version)
        self.histograms.remove(model, version)
        self._hot.pop(key, None)
        with self.device_memory._lock:
            self.device_memory.instances.pop(key, None)


def _remove(gauge: Gauge, labels: tuple[str, ...]) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:
        pass
