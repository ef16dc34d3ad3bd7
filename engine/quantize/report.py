"""How far the int8 model is from the float one, layer by layer: both run on a few calibration inputs, and every
int8 blob of the written model (dequantized with its scale) is compared with the same blob of the float graph
(cosine similarity, max abs error, the float blob's max |x| for scale); the outputs also get top-1 agreement
when they look like class scores. A 1x1 conv's blob that the reader fuses into the add after it (as TNN's
runtime does) has no row: its add's row covers both."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.ir import Graph, Value
from engine.quantize.calibrate import Sample, with_outputs
from engine.quantize.plan import Int8Plan
from engine.runtime.model import load
from engine.runtime.options import EngineOptions

_BAD = re.compile(r'[\s,":]')  # characters the TNN writer replaces in blob names


@dataclass
class LayerError:
    name: str  # the blob
    op: str  # the int8 layer writing it
    shape: tuple[int, ...]
    cosine: float
    max_abs: float
    ref_max: float


@dataclass
class OutputError:
    name: str
    cosine: float
    max_abs: float
    ref_max: float
    top1: float | None  # share of inputs whose argmax over axis 1 agrees; None for outputs that are no scores


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(a @ b / (na * nb))


def compare(graph: Graph, plan: Int8Plan, scales: dict[Value, np.ndarray], proto: Path, samples: Sequence[Sample],
            options: EngineOptions | None = None) -> tuple[list[LayerError], list[OutputError]]:
    int8_model = load(proto)
    by_name = {v.name: v for v in int8_model.graph.values()}
    blobs, ops = [], {}
    for node in plan.kinds:
        v = plan.output_of(node)
        name = _BAD.sub("_", v.name)
        # a graph output's int8 blob is `<name>__int8`; a 1x1 conv's blob fused into the add after it is gone
        found = [q for q in (by_name.get(name), by_name.get(f"{name}__int8")) if q is not None and q.dtype == np.int8]
        if found:
            blobs.append((v, found[0]))
            ops[v] = plan.kinds[node]
    ref = with_outputs(graph, [v for v, _ in blobs], samples[0], options)
    got = with_outputs(int8_model.graph, [q for _, q in blobs], samples[0], options)
    pairs: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for sample in samples:
        r, g = ref.run(sample), got.run(sample)
        for v, q in blobs:
            s = np.asarray(scales[v], np.float32)
            s = s.reshape((1, -1) + (1,) * (g[q.name].ndim - 2)) if s.size > 1 else s.reshape(())
            pairs.setdefault(v.name, []).append((r[v.name], g[q.name].astype(np.float32) * s))
        for v in graph.outputs:
            pairs.setdefault(f"output:{v.name}", []).append((r[v.name], g[v.name]))
    layers = [_layer(v, ops[v], pairs[v.name]) for v, _ in blobs]
    outputs = [_output(v, pairs[f"output:{v.name}"]) for v in graph.outputs]
    return layers, outputs


def _stack(pairs) -> tuple[np.ndarray, np.ndarray]:
    return np.stack([a for a, _ in pairs]), np.stack([b for _, b in pairs])


def _layer(v: Value, op: str, pairs) -> LayerError:
    a, b = _stack(pairs)
    return LayerError(v.name, op, tuple(a.shape[1:]), cosine(a, b), float(np.abs(a - b).max()),
                      float(np.abs(a).max()))


def _output(v: Value, pairs) -> OutputError:
    a, b = _stack(pairs)
    top1 = None
    if a.ndim >= 3 and a.shape[2] > 1 and all(d == 1 for d in a.shape[3:]):  # (samples, N, classes, 1, 1)
        flat_a, flat_b = a.reshape(-1, a.shape[2]), b.reshape(-1, b.shape[2])
        top1 = float(np.mean(flat_a.argmax(axis=1) == flat_b.argmax(axis=1)))
    return OutputError(v.name, cosine(a, b), float(np.abs(a - b).max()), float(np.abs(a).max()), top1)


def format_table(layers: Sequence[LayerError], outputs: Sequence[OutputError], counts: dict[str, int],
                 proto: Path) -> str:
    lines = [f"int8 model: {proto} (+ .tnnmodel); ops: "
             + ", ".join(f"{op} {n}" for op, n in counts.items())]
    if layers:
        width = max(len(e.name) for e in layers)
        lines.append(f"{'blob':<{width}}  {'layer':<16} {'cosine':>9} {'max abs':>10} {'max |fp32|':>10}")
        for e in layers:
            lines.append(f"{e.name:<{width}}  {e.op:<16} {e.cosine:9.5f} {e.max_abs:10.4g} {e.ref_max:10.4g}")
    for o in outputs:
        top1 = "" if o.top1 is None else f", top-1 agreement {o.top1:.3f}"
        lines.append(f"output {o.name}: cosine {o.cosine:.5f}, max abs {o.max_abs:.4g} (max |fp32| "
                     f"{o.ref_max:.4g}){top1}")
    return "\n".join(lines)
