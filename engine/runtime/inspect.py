"""A model's summary for `inspect`: format, inputs, outputs, op counts, memory plan, unsupported ops.

Unlike `engine.load`, it does not stop at unsupported ops: it lists them instead of the memory plan.
"""

from __future__ import annotations

from pathlib import Path

from engine.errors import EngineError, UnsupportedOpError
from engine.formats.registry import FORMATS
from engine.runtime.loading import model_format, prepare, read_graph, refusal_reason, unsupported_nodes
from engine.runtime.model import Model
from engine.runtime.options import EngineOptions


def describe(path: str | Path, max_shapes: dict[str, tuple[int, ...]] | None = None,
             options: EngineOptions | None = None) -> str:
    graph = read_graph(path)
    missing = unsupported_nodes(graph)
    rejected = ""
    if not missing:
        try:
            graph = prepare(graph)
        except UnsupportedOpError as e:  # a known op type with parameters the lowering does not support
            rejected = str(e)
            graph = read_graph(path)
        missing = unsupported_nodes(graph)
    model = Model(graph, path)
    lines = [f"model: {model.path}", f"format: {model.format}"] + _spec_lines(model)
    counts = model.op_counts()
    lines.append(f"ops ({sum(counts.values())} nodes):")
    lines += [f"  {op:<24} {n}" for op, n in counts.items()]
    if missing or rejected:
        lines.append(f"unsupported ops ({len(missing) or 1} nodes):")
        lines += [f"  {n.op_type}  node {n.name!r}  at {n.where()}{refusal_reason(graph, n)}" for n in missing]
        lines += [f"  {rejected}"] if rejected else []
        lines.append("memory plan: not available until every op is supported")
    else:
        lines += _memory_lines(model, max_shapes or {}, options)
    return "\n".join(lines)


def describe_graph(path: str | Path) -> str:
    """Format, inputs, outputs and format op counts, read without weights where the format allows
    (a .tnnproto without its .tnnmodel) and without lowering: no memory plan."""
    fmt = FORMATS[model_format(path)]
    if fmt.read_without_weights is not None:
        if not Path(path).is_file():
            raise EngineError(f"{path}: no such model file")
        graph = fmt.read_without_weights(path)
        graph.path = graph.path or str(path)
    else:
        graph = read_graph(path)
    model = Model(graph, path)
    lines = [f"model: {model.path}", f"format: {model.format} (graph only: no weights read, not lowered)"]
    for title, values in (("inputs", graph.inputs), ("outputs", graph.outputs)):
        lines.append(f"{title}:")  # shapes and dtypes the file does not record show as '?'
        lines += [f"  {v.name}  {v.dtype if v.dtype is not None else '?'}  "
                  f"{list(v.shape) if v.shape is not None else '?'}" for v in values]
    counts = model.op_counts()
    lines.append(f"ops ({sum(counts.values())} nodes):")
    lines += [f"  {op:<24} {n}" for op, n in counts.items()]
    return "\n".join(lines)


def _spec_lines(model: Model) -> list[str]:
    lines = []
    for title, specs in (("inputs", model.inputs), ("outputs", model.outputs)):
        lines.append(f"{title}:")
        lines += [f"  {s.name}  {_dtype(s)}  {list(s.shape)}" for s in specs]
    return lines


def _dtype(spec) -> str:
    try:
        return spec.datatype
    except KeyError:
        return str(spec.dtype)


def _memory_lines(model: Model, max_shapes: dict, options: EngineOptions | None) -> list[str]:
    try:
        inst = model.instance(max_shapes=max_shapes or None, options=options)
    except EngineError as e:
        return [f"memory plan: not available ({e})"]
    p = inst.memory_plan
    shapes = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in inst.max_shapes.items())
    ratio = p.arena_bytes / p.naive_bytes if p.naive_bytes else 1.0
    rows = [("naive", p.naive_bytes), ("peak live", p.peak_live_bytes), ("arena", p.arena_bytes),
            ("workspace", p.workspace_bytes), ("weights", p.weights_bytes)]
    lines = [f"memory plan (max shapes {shapes}; {p.strategy}; arena = {ratio:.1%} of naive):"]
    lines += [f"  {label:<10} {n:>14,d} bytes  ({n / 2**20:.2f} MiB)" for label, n in rows]
    if inst.fallback_nodes:
        lines.append(f"reference fallback nodes: {len(inst.fallback_nodes)}")
    return lines
