"""Triton's trace extension: sampled requests' timestamps written to a JSON trace file, and the settings behind it
(global, and per model), read and changed through /v2[/models/NAME]/trace/setting and the TraceSetting RPC.

The file, its format and the settings follow Triton's tracer (server src/tracer.cc) in "triton" mode:
- `trace_level` OFF or TIMESTAMPS (TENSORS is accepted by Triton's API but nnserve records no tensors: refused);
  `trace_rate` N: one request in N is traced; `trace_count` how many more traces to take (-1: no limit);
  `log_frequency` N: every N traces go to `<trace_file>.<index>`; 0: all go to `<trace_file>` at shutdown, but
  that buffer is bounded (MAX_BUFFERED_TRACES, MAX_BUFFERED_BYTES): past the bound, what is buffered goes to an
  indexed file as with log_frequency, so an unlimited trace_count does not hold every trace in memory until then.
- A trace is a list of JSON objects: `{"id": N, "model_name": ..., "model_version": V[, "request_id": ...]}` and
  one `{"id": N, "timestamps": [{"name": ACTIVITY, "ns": T}]}` per activity, T on the monotonic clock:
  REQUEST_START, QUEUE_START, COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END, REQUEST_END.
- The trace file is set when the server starts (--trace-config triton,file=PATH) and cannot be changed over the
  network (Triton's rule); settings per model mirror the global ones for every field they do not set.
Triton's other mode, `--trace-config mode=opentelemetry`, sends the same activities as OTLP spans to a collector
instead (server/otlp_export.py); sampling and the settings API are the same, the file settings do not apply.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from server.errors import InvalidArgumentError, UnsupportedError
from server.otlp_export import OtelConfig, OtlpExporter, SpanContext, collector_url, model_spans, parse_traceparent

log = logging.getLogger("nnserve.trace")

FIELDS = ("trace_level", "trace_rate", "trace_count", "log_frequency")
LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
MIN_COUNT = -1
UINT32_MAX, INT32_MAX = 2**32 - 1, 2**31 - 1
TRITON_MODE, OTEL_MODE = "triton", "opentelemetry"
ACTIVITIES = ("REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
              "COMPUTE_END", "REQUEST_END")


@dataclass(frozen=True)
class TraceConfig:
    """The values of one setting (Triton's defaults: tracing off, 1 in 1000, no limit, written at shutdown)."""

    level: str = "OFF"  # "OFF" or "TIMESTAMPS"
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = TRITON_MODE  # or OTEL_MODE
    otel: OtelConfig = field(default_factory=OtelConfig)

    def as_settings(self) -> dict[str, Any]:
        """Triton's response: trace_level a list, every other value a string."""
        return {"trace_level": [self.level], "trace_rate": str(self.rate), "trace_count": str(self.count),
                "log_frequency": str(self.log_frequency), "trace_file": self.file, "trace_mode": self.mode}

    def invalid_reason(self) -> str:
        if self.level == "OFF":
            return "tracing is disabled"
        if self.rate == 0 and self.mode == TRITON_MODE:  # OpenTelemetry's rate 0: only propagated contexts
            return "sample rate must be non-zero"
        if not self.file and self.mode == TRITON_MODE:
            return "trace file name is not given"
        return ""


# A requested change: field -> new value, or None to clear it (fall back to the global / start-up value).
Update = dict[str, Any]


def parse_update(settings: dict[str, Any]) -> Update:
    """A trace setting request (HTTP JSON, or the gRPC map as lists of strings) as an Update; Triton's checks and
    words."""
    if "trace_file" in settings:
        raise UnsupportedError("trace file location can not be updated through network protocol")
    update: Update = {}
    for key, value in settings.items():
        if key not in FIELDS:
            continue  # as Triton: other keys are ignored
        if value is None or value == []:
            update[key] = None
        elif key == "trace_level":
            level = _level(value)
            if level is not None:
                update[key] = level
        else:
            update[key] = _number(key, value)
    return update


def _level(value: Any) -> str | None:
    """OFF or TIMESTAMPS; None when no level is named (Triton then leaves the level as it is)."""
    levels = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) for v in levels):
        raise InvalidArgumentError("'trace_level' must be a list of strings")
    if "OFF" in levels:
        if len(levels) != 1:
            raise InvalidArgumentError("Expect only one trace level 'OFF' is specified")
        return "OFF"
    if "TENSORS" in levels:
        raise UnsupportedError("trace level TENSORS is not supported: nnserve traces timestamps only")
    return "TIMESTAMPS" if "TIMESTAMPS" in levels else None


def _number(key: str, value: Any) -> int:
    if isinstance(value, list):
        if len(value) != 1:
            raise InvalidArgumentError(f"expect only 1 value for '{key}'")
        value = value[0]
    if not isinstance(value, str):
        raise InvalidArgumentError(f"Unable to parse '{key}', expected a string, got {type(value).__name__}")
    low, high = (MIN_COUNT, INT32_MAX) if key == "trace_count" else (0, UINT32_MAX)
    try:
        number = int(value.strip())
    except ValueError:
        raise InvalidArgumentError(f"Unable to parse '{key}', got: {value[:64]}") from None
    if key == "trace_count" and number < MIN_COUNT:
        raise InvalidArgumentError(f"Unable to parse '{key}'. Expecting value >= {MIN_COUNT}, got: {value[:64]}")
    if not low <= number <= high:
        raise InvalidArgumentError(f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: "
                                   f"{value[:64]}")
    return number


# The most traces (and their bytes) held in memory for the shutdown write (log_frequency 0); past either, they are
# written to the next indexed file.
MAX_BUFFERED_TRACES = 10_000
MAX_BUFFERED_BYTES = 16 * 2**20
_ATTR = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}


class TraceFile:
    """One trace file path. Traces written at shutdown (log_frequency 0) go to the path itself as one JSON list,
    the others each batch to `<path>.<index>`, a JSON list of its own."""

    def __init__(self, path: str):
        self.path = path
        self._index = itertools.count()
        self._main: list[str] = []
        self._main_bytes = 0
        self._lock = threading.Lock()

    def save(self, traces: list[str], indexed: bool) -> None:
        if not traces:
            return
        if indexed:
            self._write(f"{self.path}.{next(self._index)}", traces)
            return
        with self._lock:
            self._main.extend(traces)
            self._main_bytes += sum(len(t) for t in traces)
            spill = over_bound(len(self._main), self._main_bytes)
            if spill:
                traces, self._main, self._main_bytes = self._main, [], 0
        if spill:
            self._write(f"{self.path}.{next(self._index)}", traces)

    def close(self) -> None:
        with self._lock:
            traces, self._main = self._main, []
        if traces:
            self._write(self.path, traces)

    def _write(self, path: str, traces: list[str]) -> None:
        try:
            Path(path).write_text("[" + ",".join(traces) + "]")
        except OSError as exc:
            log.error("failed creating trace file %s: %s", path, exc)


def over_bound(count: int, nbytes: int) -> bool:
    """Whether traces held for the shutdown write have reached the bound past which they are written now."""
    return count >= MAX_BUFFERED_TRACES or nbytes >= MAX_BUFFERED_BYTES


@dataclass
class Setting:
    """A setting in force: its values, which of them it sets itself (the rest mirror the global setting), and its
    sampling state (Triton replaces the object on every update, so the counts start afresh)."""

    config: TraceConfig
    specified: frozenset[str] = frozenset()
    file: TraceFile | None = None
    exporter: OtlpExporter | None = None  # OpenTelemetry mode: traces go there as spans
    seen: int = 0  # requests that asked to be sampled
    remaining: int = -1  # traces still to take (-1: no limit)
    pending: int = 0  # sampled traces not yet finished
    buffered: list[str] = field(default_factory=list)
    buffered_bytes: int = 0
    collected: int = 0
    retired: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.remaining = self.config.count

    def sample(self, propagated: bool = False) -> bool:
        """Whether to trace the next request; one that brings a trace context (OpenTelemetry mode) is traced
        whatever the rate and count, as Triton does."""
        with self._lock:
            if self.config.invalid_reason():
                return False
            if not propagated:
                if self.remaining == 0 or self.config.rate == 0:
                    return False
                self.seen += 1
                if self.seen % self.config.rate:
                    return False
                if self.remaining > 0:
                    self.remaining -= 1
            self.pending += 1
            return True

    def finish(self, text: str) -> None:
        """A sampled trace is done: buffered, and saved when Triton would save it."""
        with self._lock:
            self.pending -= 1
            self.buffered.append(text)
            self.buffered_bytes += len(text)
            self.collected += 1
            freq = self.config.log_frequency
            full = ((freq and len(self.buffered) >= freq) or (self.remaining == 0 and self.pending == 0)
                    or over_bound(len(self.buffered), self.buffered_bytes))
            flush = self.buffered if (full or self.retired) else None
            if flush is not None:
                self.buffered, self.buffered_bytes = [], 0
        if flush and self.file is not None:
            self.file.save(flush, indexed=bool(full) or bool(freq))

    def finish_spans(self, spans: list[dict[str, Any]]) -> None:
        """A sampled trace is done, in OpenTelemetry mode: its spans go to the exporter's queue."""
        with self._lock:
            self.pending -= 1
            self.collected += 1
        if self.exporter is not None:
            self.exporter.add(spans)

    def retire(self) -> None:
        """Replaced by an update, or the server stops: what is buffered is saved (to an indexed file when
        log_frequency is set, else with the shutdown write)."""
        with self._lock:
            self.retired = True
            flush, self.buffered, self.buffered_bytes = self.buffered, [], 0
        if flush and self.file is not None:
            self.file.save(flush, indexed=bool(self.config.log_frequency))


class Trace:
    """One sampled request: its activities, written as Triton writes them when it finishes."""

    _ids = itertools.count(1)

    def __init__(self, setting: Setting, model: str, version: str, request_id: str,
                 parent: SpanContext | None = None):
        self.id = next(Trace._ids)
        self.setting = setting
        self.parent = parent  # the client's span (OpenTelemetry's propagated context)
        self.head: dict[str, Any] = {"id": self.id, "model_name": model, "model_version": int(version or 0)}
        if request_id:
            self.head["request_id"] = request_id
        self.stamps: list[tuple[str, int]] = []

    def stamp(self, activity: str, ns: int) -> None:
        self.stamps.append((activity, ns))

    def finish(self) -> None:
        exporter = self.setting.exporter
        if exporter is not None:
            self.setting.finish_spans(model_spans(self.head, self.stamps, exporter.clock_offset_ns, self.parent))
            return
        objects = [json.dumps(self.head, separators=(",", ":"))]
        objects += [json.dumps({"id": self.id, "timestamps": [{"name": name, "ns": ns}]}, separators=(",", ":"))
                    for name, ns in self.stamps]
        self.setting.finish(",".join(objects))


class Tracer:
    """The global setting (initially from --trace-config), per-model settings, and sampling."""

    def __init__(self, initial: TraceConfig | None = None):
        self.default = initial or TraceConfig()
        self._files: dict[str, TraceFile] = {}
        self.exporter = OtlpExporter(self.default.otel) if self.default.mode == OTEL_MODE else None
        self.global_setting = self._setting(self.default, frozenset())
        self.models: dict[str, Setting] = {}
        self._lock = threading.Lock()
        self.active = self._any_enabled()

    def _setting(self, config: TraceConfig, specified: frozenset[str]) -> Setting:
        file = None
        if config.file and self.exporter is None:
            file = self._files.setdefault(config.file, TraceFile(config.file))
        return Setting(config, specified, file, self.exporter)

    def _any_enabled(self) -> bool:
        return self.global_setting.config.level != "OFF" or any(s.config.level != "OFF" for s in self.models.values())

    def settings(self, model: str = "") -> dict[str, Any]:
        """Triton's answer: the setting in force, with trace_count the traces it may still take."""
        setting = self.models.get(model, self.global_setting) if model else self.global_setting
        return {**setting.config.as_settings(), "trace_count": str(setting.remaining)}

    def update(self, update: Update, model: str = "") -> None:
        with self._lock:
            if model:
                self._update_model(model, update)
            else:
                new = self._merged(self.global_setting, self.default, update)
                self._replace(None, new)
                for name, setting in list(self.models.items()):  # the fields they mirror follow the global ones
                    self._update_model(name, {}, setting)
            self.active = self._any_enabled()

    def _update_model(self, model: str, update: Update, current: Setting | None = None) -> None:
        current = current or self.models.get(model)
        new = self._merged(current, self.global_setting.config, update)
        if not new.specified:  # nothing of its own: the model uses the global setting
            old = self.models.pop(model, None)
            if old is not None:
                old.retire()
            return
        self._replace(model, new)

    def _merged(self, current: Setting | None, fallback: TraceConfig, update: Update) -> Setting:
        specified = set(current.specified if current else ())
        values = {attr: getattr(fallback, attr) for attr in _ATTR.values()}
        for key, attr in _ATTR.items():
            if key in update and update[key] is None:
                specified.discard(key)
            elif key in update:
                specified.add(key)
                values[attr] = update[key]
            elif key in specified and current is not None:
                values[attr] = getattr(current.config, attr)
        config = replace(fallback, **values)
        reason = config.invalid_reason()
        if reason and config.level != "OFF":  # the one invalid setting allowed is "off"
            raise InvalidArgumentError(f"Attempting to set invalid trace setting :{reason}")
        return self._setting(config, frozenset(specified))

    def _replace(self, model: str | None, new: Setting) -> None:
        old = self.global_setting if model is None else self.models.get(model)
        if model is None:
            self.global_setting = new
        else:
            self.models[model] = new
        if old is not None:
            old.retire()

    @property
    def propagates(self) -> bool:
        """Whether requests' trace contexts (W3C traceparent) matter: in OpenTelemetry mode."""
        return self.exporter is not None

    def sample(self, model: str, version: str, request_id: str, traceparent: str = "") -> Trace | None:
        """A Trace when this request is sampled. The common case, tracing off everywhere, is one attribute read."""
        if not self.active:
            return None
        setting = self.models.get(model, self.global_setting)
        parent = parse_traceparent(traceparent) if traceparent and self.exporter is not None else None
        return Trace(setting, model, version, request_id, parent) if setting.sample(parent is not None) else None

    def close(self) -> None:
        """Shutdown: buffered traces are written."""
        with self._lock:
            for setting in [self.global_setting, *self.models.values()]:
                setting.retire()
            for file in self._files.values():
                file.close()
        if self.exporter is not None:
            self.exporter.shutdown()


def parse_trace_config(specs: list[str]) -> TraceConfig:
    """--trace-config values, Triton's forms: `[triton,]file=PATH`, `level=TIMESTAMPS`, `rate=N`, `count=N`,
    `log_frequency=N` (also `log-frequency`), `mode=triton|opentelemetry`, and OpenTelemetry's
    `opentelemetry,url=HOST:PORT/PATH`, `opentelemetry,resource=KEY=VALUE` (repeatable),
    `opentelemetry,bsp_max_queue_size=N`, `bsp_schedule_delay=MS`, `bsp_max_export_batch_size=N`. Raises ValueError
    with the reason."""
    values: dict[str, Any] = {}
    otel: dict[str, Any] = {}
    resource = dict(OtelConfig().resource)
    for spec in specs:
        scope, sep, kv = spec.partition(",")
        if not sep:
            scope, kv = "", spec
        if scope not in ("", TRITON_MODE, OTEL_MODE):
            raise ValueError(f"--trace-config '{spec}': unknown mode '{scope}' (expected triton or opentelemetry)")
        key, eq, value = kv.partition("=")
        key = key.strip().replace("-", "_")
        if not eq:
            raise ValueError(f"--trace-config '{spec}': expected [triton,|opentelemetry,]<setting>=<value>")
        if scope == OTEL_MODE:
            _otel_setting(spec, key, value, otel, resource)
        elif key == "mode":
            if value not in (TRITON_MODE, OTEL_MODE):
                raise ValueError(f"--trace-config '{spec}': unknown mode '{value}' (triton or opentelemetry)")
            values["mode"] = value
        elif key == "file":
            values["file"] = value
        elif key == "level":
            try:
                values["level"] = _level([v.strip().upper() for v in value.split(",") if v.strip()]) or "OFF"
            except (InvalidArgumentError, UnsupportedError) as exc:
                raise ValueError(f"--trace-config '{spec}': {exc.message}") from None
        elif key in ("rate", "count", "log_frequency"):
            try:
                values[key] = _number("trace_count" if key == "count" else key, value)
            except InvalidArgumentError as exc:
                raise ValueError(f"--trace-config '{spec}': {exc.message}") from None
        else:
            raise ValueError(f"--trace-config '{spec}': unknown setting '{key}' (file, level, rate, count, "
                             "log_frequency, mode)")
    config = TraceConfig(**values, otel=OtelConfig(resource=resource, **otel))
    config.otel.check()
    reason = config.invalid_reason()
    if reason and config.level != "OFF":
        raise ValueError(f"--trace-config: invalid trace setting: {reason}")
    return config


_OTEL_NUMBERS = {"bsp_max_queue_size": "max_queue_size", "bsp_schedule_delay": "schedule_delay_ms",
                 "bsp_max_export_batch_size": "max_export_batch_size"}


def _otel_setting(spec: str, key: str, value: str, otel: dict[str, Any], resource: dict[str, str]) -> None:
    if key == "url":
        otel["url"] = collector_url(value.strip())
    elif key == "resource":
        name, eq, attr = value.partition("=")
        if not eq or not name.strip():
            raise ValueError(f"--trace-config '{spec}': expected opentelemetry,resource=<key>=<value>")
        resource[name.strip()] = attr
    elif key in _OTEL_NUMBERS:
        try:
            otel[_OTEL_NUMBERS[key]] = int(value)
        except ValueError:
            raise ValueError(f"--trace-config '{spec}': {key} must be an integer") from None
    else:
        raise ValueError(f"--trace-config '{spec}': unknown OpenTelemetry setting '{key}' (url, resource, "
                         "bsp_max_queue_size, bsp_schedule_delay, bsp_max_export_batch_size)")
