"""Calibration statistics: the float graph runs on every calibration input while the blobs that need a scale are
read out (as extra graph outputs), per channel (axis 1) or merged, in TNN's two passes: the range of |x| first,
then (for `kl` and `percentile`) 2048-bin histograms of |x| over that range."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.errors import EngineError
from engine.ir import Graph, Value
from engine.quantize.scales import BINS, interval
from engine.runtime.instance import Instance
from engine.runtime.options import EngineOptions

Sample = dict[str, np.ndarray]


@dataclass
class BlobStats:
    merged: bool  # one scale for the whole blob
    max_abs: np.ndarray  # (channels,) or (1,)
    hist: np.ndarray | None = None  # (channels, BINS) counts of |x| > 0
    pixels: int = 0  # H * W of a 4-D blob, 1 otherwise (TNN: fewer than 100 means min-max)
    channel_sum: np.ndarray | None = None  # per channel (axis 1), whatever `merged` says: for bias correction
    count: int = 0
    _interval: np.ndarray | None = field(default=None, repr=False)

    @property
    def channel_mean(self) -> np.ndarray:
        return self.channel_sum / max(self.count, 1)

    def update_range(self, x: np.ndarray) -> None:
        rows = _rows(x, self.merged)
        self.max_abs = np.maximum(self.max_abs, np.abs(rows).max(axis=1) if rows.shape[1] else 0)
        per_channel = _rows(x, False).astype(np.float64)
        self.channel_sum = per_channel.sum(axis=1) + (0 if self.channel_sum is None else self.channel_sum)
        self.count += per_channel.shape[1]

    def update_hist(self, x: np.ndarray) -> None:
        if self._interval is None:
            self._interval = interval(self.max_abs)
            self.hist = np.zeros((self.max_abs.size, BINS), np.float64)
        rows = np.abs(_rows(x, self.merged)).astype(np.float32)
        idx = np.minimum((rows * self._interval[:, None]).astype(np.int64), BINS - 1)
        keep = (rows != 0) & (self._interval[:, None] > 0)
        flat = (np.arange(rows.shape[0])[:, None] * BINS + idx)[keep]
        self.hist += np.bincount(flat, minlength=self.hist.size).reshape(self.hist.shape)


def _rows(x: np.ndarray, merged: bool) -> np.ndarray:
    """(channels, values) of a blob, channels on axis 1 (one row when merged or for a rank < 2)."""
    if merged or x.ndim < 2:
        return x.reshape(1, -1)
    return np.moveaxis(x, 1, 0).reshape(x.shape[1], -1)


def observe(graph: Graph, blobs: Sequence[Value], merged: Callable[[Value], bool], samples: Sequence[Sample],
            histograms: bool, options: EngineOptions | None = None,
            progress: Callable[[str, int], Callable[[], None]] | None = None) -> dict[Value, BlobStats]:
    """Statistics of `blobs` over `samples` (one or two passes); `progress(label, total)` returns a step callback."""
    instance = with_outputs(graph, blobs, samples[0], options)
    stats: dict[Value, BlobStats] = {}
    for v in blobs:
        m = merged(v)
        channels = 1 if m or v.shape is None or len(v.shape) < 2 else int(v.shape[1])
        pixels = int(np.prod(v.shape[2:])) if v.shape is not None and len(v.shape) == 4 else 1
        stats[v] = BlobStats(m, np.zeros(channels, np.float32), pixels=pixels)
    passes = [("ranges", BlobStats.update_range)] + ([("histograms", BlobStats.update_hist)] if histograms else [])
    for label, update in passes:
        step = progress(f"calibration {label}", len(samples)) if progress else None
        for sample in samples:
            out = {**sample, **instance.run(sample)}
            for v in blobs:
                update(stats[v], out[v.name])
                if not np.isfinite(stats[v].max_abs).all():  # made by the model from finite data: no scale fits
                    raise EngineError(f"calibration: the model computes a NaN or an infinity in '{v.name}' "
                                      f"(made at {v.producer.where() if v.producer else 'the input'}); its int8 "
                                      f"scales cannot be found")
            if step:
                step()
    return stats


def with_outputs(graph: Graph, blobs: Sequence[Value], sample: Sample, options: EngineOptions | None) -> Instance:
    """A CPU instance of `graph` that also returns `blobs`, sized for `sample`'s shapes."""
    extra = [v for v in blobs if v not in graph.outputs and v not in graph.inputs]
    view = Graph(nodes=graph.nodes, inputs=graph.inputs, outputs=[*graph.outputs, *extra], path=graph.path,
                 meta=dict(graph.meta), _names=graph._names)
    return Instance(view, "cpu", max_shapes={k: a.shape for k, a in sample.items()}, options=options)
