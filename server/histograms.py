"""The server's histograms (request, queue and compute latency, batch size), labelled (model, version).

Kept as plain bucket counts and exposed through one prometheus collector: prometheus-client's Histogram takes two
locks and walks its buckets in Python on every observe, four times per request, which cost more than the rest of
the metrics work of a small model's request. The exposition is the same `_bucket{le=...}`, `_count` and `_sum`.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString


class Series:
    """One (model, version) of one histogram: counts per bucket (`le` inclusive, the last is +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class Histograms:
    """A prometheus collector of several histogram families."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, tuple[str, tuple[float, ...]]] = {}
        self._series: dict[str, dict[tuple[str, str], Series]] = {}

    def family(self, name: str, doc: str, bounds: tuple[float, ...]) -> None:
        self._families[name] = (doc, tuple(sorted(bounds)))
        self._series[name] = {}

    def series(self, name: str, model: str, version: str) -> Series:
        """The series of (model, version), created empty on first use (it is then exposed from 0)."""
        with self._lock:
            by_labels = self._series[name]
            found = by_labels.get((model, version))
            if found is None:
                found = by_labels[(model, version)] = Series(self._families[name][1])
            return found

    def remove(self, model: str, version: str) -> None:
        """The series of (model, version), from every family (a Series already handed out is no longer exposed)."""
        with self._lock:
            for by_labels in self._series.values():
                by_labels.pop((model, version), None)

    def observe(self, *samples: tuple[Series, float]) -> None:
        """Several observations (of one request) under one lock."""
        with self._lock:
            for series, value in samples:
                series.observe(value)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            snapshot = {name: [(labels, list(s.counts), s.sum) for labels, s in by_labels.items()]
                        for name, by_labels in self._series.items()}
        for name, (doc, bounds) in self._families.items():
            family = HistogramMetricFamily(name, doc, labels=["model", "version"])
            les = [floatToGoString(b) for b in bounds] + ["+Inf"]
            for labels, counts, total in snapshot[name]:
                cumulative, buckets = 0, []
                for le, count in zip(les, counts, strict=True):
                    cumulative += count
                    buckets.append((le, cumulative))
                family.add_metric(list(labels), buckets, total)
            yield family
