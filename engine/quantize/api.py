"""quantize(): float model + calibration inputs -> TNN int8 model files, and how far each layer moved."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.errors import EngineError
from engine.formats.tnn.writer.write import write_tnn
from engine.ir import Graph, Value
from engine.quantize.build import build_int8
from engine.quantize.calibrate import BlobStats, Sample, observe
from engine.quantize.loading import float_graph
from engine.quantize.plan import Int8Plan, plan_int8
from engine.quantize.report import LayerError, OutputError, compare, format_table
from engine.quantize.scales import METHODS, kl_scales, minmax_scales, percentile_scales
from engine.runtime.options import EngineOptions

Progress = Callable[[str, int], Callable[[], None]]
SMALL_MAP = 100  # TNN: maps with fewer pixels take min-max whatever the method


@dataclass(frozen=True)
class QuantizeOptions:
    method: str = "minmax"  # minmax | kl | percentile
    percentile: float = 99.99
    per_channel_activations: bool = True  # TNN's default (its -c flag merges them)
    per_channel_weights: bool = True
    bias_correction: bool = True  # not in TNN's tool; the file is the same kind either way
    report_samples: int = 4  # calibration inputs the per-layer report runs (0: none)
    batch: int = 1  # the batch the TNN file records for each input (TNN files fix their input shapes)


@dataclass
class QuantizeResult:
    proto: Path
    model: Path
    plan: Int8Plan
    scales: dict[Value, np.ndarray]
    layers: list[LayerError] = field(default_factory=list)
    outputs: list[OutputError] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


def quantize(model_path: str | Path, samples: Sequence[Sample], output_prefix: str | Path,
             options: QuantizeOptions = QuantizeOptions(), progress: Progress | None = None,
             engine_options: EngineOptions | None = None) -> QuantizeResult:
    if options.method not in METHODS:
        raise EngineError(f"unknown calibration method {options.method!r}; known: {', '.join(METHODS)}")
    if not samples:
        raise EngineError("no calibration inputs")
    graph = float_graph(model_path)
    plan = plan_int8(graph)
    if not plan.kinds:
        raise EngineError(f"{model_path}: no layer TNN's int8 format can hold (convolutions, inner products, ...)")
    _check_samples(graph, samples)

    def merged(v: Value) -> bool:
        return not options.per_channel_activations or v in plan.per_tensor or v.shape is None or len(v.shape) != 4

    stats = observe(graph, plan.scaled, merged, samples, options.method != "minmax", engine_options, progress)
    scales = blob_scales(graph, plan, stats, options)
    means = {v: st.channel_mean for v, st in stats.items()} if options.bias_correction else None
    int8 = build_int8(graph, plan, scales, options.per_channel_weights, means)
    # a TNN file records one shape per input: the calibration inputs' with the batch asked for
    shapes = {k: (options.batch, *a.shape[1:]) for k, a in samples[0].items()}
    proto, model = write_tnn(int8, output_prefix, input_shapes=shapes)
    result = QuantizeResult(proto, model, plan, scales, counts=int8.op_counts())
    if options.report_samples:
        result.layers, result.outputs = compare(graph, plan, scales, proto, _batched(samples, options.batch)
                                                [:options.report_samples], engine_options)
    return result


def _batched(samples: Sequence[Sample], batch: int) -> list[Sample]:
    """The samples as the written model takes them: `batch` items each (rows taken in turn from the samples)."""
    rows = [{k: a[i:i + 1] for k, a in s.items()} for s in samples for i in range(next(iter(s.values())).shape[0])]
    return [{k: np.concatenate([r[k] for r in rows[i:i + batch]]) for k in rows[0]}
            for i in range(0, len(rows) - batch + 1, batch)]


def _check_samples(graph: Graph, samples: Sequence[Sample]) -> None:
    names = [v.name for v in graph.inputs]
    for k, s in enumerate(samples):
        if sorted(s) != sorted(names):
            raise EngineError(f"calibration input {k} has {sorted(s)}; the model takes {names}")
        if any(s[n].shape != samples[0][n].shape for n in names):
            raise EngineError(f"calibration input {k} has shapes {[s[n].shape for n in names]}, the first one "
                              f"{[samples[0][n].shape for n in names]}: all must have the same")
        for n in names:  # a NaN or an infinity would make every scale and bias of the file wrong, silently
            a = np.asarray(s[n])
            if a.dtype.kind == "f" and a.size and not (np.isfinite(a.min()) and np.isfinite(a.max())):
                raise EngineError(f"calibration input {k}'s '{n}' holds a NaN or an infinity: calibration data "
                                  f"must be finite")


def blob_scales(graph: Graph, plan: Int8Plan, stats: dict[Value, BlobStats], options: QuantizeOptions) \
        -> dict[Value, np.ndarray]:
    """Float32 scale(s) of every planned blob: by the method (min-max for the model's inputs and small maps), then
    TNN's merging (a ReLU's or max pool's input takes its output's scale) and, for concats of per-channel blobs,
    the output's channels taking their inputs' scales (the bytes are copied as they are)."""
    scales: dict[Value, np.ndarray] = {}
    for v, st in stats.items():
        method = "minmax" if v in graph.inputs or st.pixels < SMALL_MAP else options.method
        if method == "kl":
            scales[v] = kl_scales(st.hist, st.max_abs)
        elif method == "percentile":
            scales[v] = percentile_scales(st.hist, st.max_abs, options.percentile)
        else:
            scales[v] = minmax_scales(st.max_abs)
    for v, s in scales.items():
        scales[v] = _live(s)
    for src, dst in plan.tied_pairs():
        scales[src] = scales[dst]
    for node, kind in plan.kinds.items():
        if kind == "TnnQConcat" and any(scales[v].size > 1 for v in [*node.inputs, node.outputs[0]]):
            scales[node.outputs[0]] = np.concatenate([np.broadcast_to(scales[v], (v.shape[1],))
                                                      for v in node.inputs]).astype(np.float32)
    return scales


def _live(scale: np.ndarray) -> np.ndarray:
    """Channels calibration never saw move (|x| < 1e-5) take the blob's largest scale instead of TNN's 0: their
    int8 values are 0 either way, but a depthwise conv reading one multiplies its weight scale by this one, and
    with 0 TNN's tool drops the channel's bias (the float model's output there is bias alone, not 0)."""
    if np.all(scale > 0):
        return scale
    top = float(scale.max())
    return np.where(scale > 0, scale, np.float32(top if top > 0 else 1.0 / 127)).astype(np.float32)


def format_report(result: QuantizeResult) -> str:
    """The per-layer error table and the outputs' summary, as `nnserve quantize` prints them."""
    return format_table(result.layers, result.outputs, result.counts, result.proto)
