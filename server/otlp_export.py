"""Triton's OpenTelemetry trace mode: sampled requests become OTLP spans, batched and POSTed to a collector.

Spans as Triton's tracer (server src/tracer.cc) makes them, from the same activities as the JSON trace file:
- `InferRequest`, the root span, from the request's start to its end;
- a model span named after the model (attributes triton.model_name, triton.model_version, triton.trace_id,
  triton.trace_parent_id, triton.request_id), its child, with the events REQUEST_START, QUEUE_START, REQUEST_END;
- `compute`, the model span's child, with the events COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START,
  COMPUTE_END.
Times are the system's real-time clock (as OpenTelemetry's, where the JSON file has the monotonic clock).

Export is OpenTelemetry's batch span processor with Triton's settings: at most `bsp_max_queue_size` spans wait (more
are dropped and counted in the log), a batch of `bsp_max_export_batch_size` goes as soon as it is full, else every
`bsp_schedule_delay` ms. The body is OTLP/HTTP JSON (trace and span ids in hex, as that encoding has them), POSTed
by one thread with a timeout, so a slow or absent collector never holds a request; what is queued at shutdown is
sent then (within the timeout).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("nnserve.trace")

DEFAULT_URL = "http://localhost:4318/v1/traces"  # Triton's and the OTLP/HTTP default
DEFAULT_RESOURCE = {"service.name": "triton-inference-server"}  # Triton's, so its users' queries find the spans
EXPORT_TIMEOUT_S = 10.0  # OTEL_EXPORTER_OTLP_TIMEOUT's default
SPAN_KIND_SERVER = 2
MAX_QUEUE_LIMIT = 1 << 20  # spans; a setting above it would let the queue hold gigabytes


@dataclass(frozen=True)
class OtelConfig:
    """`--trace-config opentelemetry,<setting>=<value>` (defaults: Triton's)."""

    url: str = DEFAULT_URL
    resource: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_RESOURCE))
    max_queue_size: int = 2048
    schedule_delay_ms: int = 5000
    max_export_batch_size: int = 512

    def check(self) -> None:
        """Raises ValueError naming the setting that cannot work."""
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"opentelemetry url '{self.url}': only http:// and https:// collectors are supported")
        for name, value, top in (("bsp_max_queue_size", self.max_queue_size, MAX_QUEUE_LIMIT),
                                 ("bsp_schedule_delay", self.schedule_delay_ms, 24 * 3600 * 1000),
                                 ("bsp_max_export_batch_size", self.max_export_batch_size, MAX_QUEUE_LIMIT)):
            if not 1 <= value <= top:
                raise ValueError(f"opentelemetry {name} must be within 1..{top}, got {value}")
        if self.max_export_batch_size > self.max_queue_size:
            raise ValueError("opentelemetry bsp_max_export_batch_size must not exceed bsp_max_queue_size")


def collector_url(value: str) -> str:
    """Triton takes `host:port/path`; a scheme may be given."""
    return value if "://" in value else f"http://{value}"


@dataclass(frozen=True)
class SpanContext:
    """A client's span, from its W3C `traceparent` header: the request's spans join its trace, under it."""

    trace_id: str
    span_id: str


_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


def parse_traceparent(value: str) -> SpanContext | None:
    """W3C Trace Context's traceparent (version-traceid-parentid-flags); None for anything invalid (the request is
    then sampled as any other, as the specification says a receiver does)."""
    m = _TRACEPARENT.match(value.strip().lower()) if len(value) <= 512 else None
    if m is None or m[1] == "ff" or (m[1] == "00" and m[5]):
        return None
    if m[2] == "0" * 32 or m[3] == "0" * 16:
        return None
    return SpanContext(m[2], m[3])


def model_spans(head: dict[str, Any], stamps: list[tuple[str, int]], clock_offset_ns: int,
                parent: SpanContext | None = None) -> list[dict[str, Any]]:
    """One request's three spans (OTLP JSON), from its activities on the monotonic clock; under the client's span
    when it sent one."""
    at = {name: ns + clock_offset_ns for name, ns in stamps}
    root_id, model_id, compute_id = (os.urandom(8).hex() for _ in range(3))
    trace_id = parent.trace_id if parent else os.urandom(16).hex()
    start, end = at.get("REQUEST_START", 0), at.get("REQUEST_END", 0)
    attributes = {"triton.model_name": head["model_name"], "triton.model_version": head["model_version"],
                  "triton.trace_id": head["id"], "triton.trace_parent_id": 0}
    if head.get("request_id"):
        attributes["triton.request_id"] = head["request_id"]
    spans = [_span(trace_id, root_id, parent.span_id if parent else "", "InferRequest", start, end, {}, []),
             _span(trace_id, model_id, root_id, head["model_name"], start, end, attributes,
                   [(n, at[n]) for n in ("REQUEST_START", "QUEUE_START", "REQUEST_END") if n in at])]
    if "COMPUTE_START" in at:
        spans.append(_span(trace_id, compute_id, model_id, "compute", at["COMPUTE_START"], at["COMPUTE_END"], {},
                           [(n, at[n]) for n in ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
                                                 "COMPUTE_END") if n in at]))
    return spans


def _span(trace_id: str, span_id: str, parent: str, name: str, start: int, end: int, attributes: dict[str, Any],
          events: list[tuple[str, int]]) -> dict[str, Any]:
    span = {"traceId": trace_id, "spanId": span_id, "name": name, "kind": SPAN_KIND_SERVER,
            "startTimeUnixNano": str(start), "endTimeUnixNano": str(end),
            "attributes": [_attribute(k, v) for k, v in attributes.items()],
            "events": [{"timeUnixNano": str(ns), "name": n} for n, ns in events]}
    if parent:
        span["parentSpanId"] = parent
    return span


def _attribute(key: str, value: Any) -> dict[str, Any]:
    # OTLP JSON: 64-bit integers as decimal strings
    return {"key": key, "value": {"intValue": str(value)} if isinstance(value, int) else {"stringValue": str(value)}}


class OtlpExporter:
    """The batch span processor: spans in from any thread, batches out from one thread of its own."""

    def __init__(self, config: OtelConfig):
        self.config = config
        self.clock_offset_ns = time.time_ns() - time.perf_counter_ns()  # the monotonic clock onto the real one
        self._queue: deque[dict[str, Any]] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self.dropped = 0
        self.exported = 0
        self._resource = {"attributes": [_attribute(k, v) for k, v in config.resource.items()]}
        self._thread = threading.Thread(target=self._run, name="nnserve-otlp-export", daemon=True)
        self._thread.start()

    def add(self, spans: list[dict[str, Any]]) -> None:
        with self._cond:
            room = self.config.max_queue_size - len(self._queue)
            if room < len(spans):
                if not self.dropped:
                    log.warning("OpenTelemetry export: the span queue is full (bsp_max_queue_size %d): spans are "
                                "dropped", self.config.max_queue_size)
                self.dropped += len(spans) - max(room, 0)
                spans = spans[:max(room, 0)]
            self._queue.extend(spans)
            if len(self._queue) >= self.config.max_export_batch_size:
                self._cond.notify()

    def shutdown(self) -> None:
        """Sends what is queued (each batch within the export timeout) and stops the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout=EXPORT_TIMEOUT_S * 2)

    def _run(self) -> None:
        delay = self.config.schedule_delay_ms / 1000
        while True:
            with self._cond:
                if not self._stopping and len(self._queue) < self.config.max_export_batch_size:
                    self._cond.wait(timeout=delay)
                batch = [self._queue.popleft() for _ in range(min(len(self._queue),
                                                                  self.config.max_export_batch_size))]
                stopping = self._stopping and not self._queue
            if batch:
                self._post(batch)
            if stopping:
                return

    def _post(self, spans: list[dict[str, Any]]) -> None:
        body = json.dumps({"resourceSpans": [{"resource": self._resource, "scopeSpans": [
            {"scope": {"name": "triton-server"}, "spans": spans}]}]}).encode()
        request = urllib.request.Request(self.config.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=EXPORT_TIMEOUT_S) as answer:  # noqa: S310 (http(s) only)
                answer.read(1 << 16)
            self.exported += len(spans)
        except (OSError, urllib.error.URLError) as exc:
            self.dropped += len(spans)
            log.warning("OpenTelemetry export of %d spans to %s failed: %s", len(spans), self.config.url, exc)
