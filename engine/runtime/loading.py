"""From a file on disk to an optimized canonical graph: pick the reader by extension, run the pipeline,
and check that every remaining op is one the engine implements."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np

from engine.errors import EngineError, UnsupportedOpError
from engine.ir import Graph, Node
from engine.ops.registry import all_ops
from engine.passes.pipeline import lowering_coverage, run_pipeline

# file suffix -> (format, reader module); readers expose load_graph(path) -> Graph
READERS: dict[str, tuple[str, str]] = {
    ".pnnx.param": ("pnnx", "engine.formats.pnnx.reader"),
    ".tnnproto": ("tnn", "engine.formats.tnn.reader"),
}


def model_format(path: str | Path) -> str:
    name = Path(path).name
    for suffix, (fmt, _) in READERS.items():
        if name.endswith(suffix):
            return fmt
    raise EngineError(f"{path}: unknown model file type; supported: "
                      f"{', '.join(f'MODEL{s}' for s in READERS)} (weights file beside it)")


def read_graph(path: str | Path) -> Graph:
    """The graph as the format reader builds it (format op names, not yet lowered)."""
    fmt = model_format(path)
    if not Path(path).is_file():
        raise EngineError(f"{path}: no such model file")
    module = next(m for s, (f, m) in READERS.items() if f == fmt)
    graph = importlib.import_module(module).load_graph(str(path))
    graph.path = graph.path or str(path)
    graph.meta.setdefault("format", fmt)
    return graph


def prepare(graph: Graph) -> Graph:
    """Lowering and optimization passes; graph inputs without a dtype are taken as float32."""
    for v in graph.inputs:
        if v.dtype is None:
            v.dtype = np.dtype(np.float32)
    return run_pipeline(graph)


def unsupported_nodes(graph: Graph) -> list[Node]:
    """Format ops no lowering handles (before lowering) and ops no kernel implements (after)."""
    ops = all_ops()
    fmt = graph.meta.get("format")
    prefix = f"{fmt}:"
    known = lowering_coverage(fmt)
    missing = []
    for n in graph.nodes:
        if n.op_type.startswith(prefix):
            if known is not None and n.op_type[len(prefix):] not in known:
                missing.append(n)
        elif n.op_type not in ops:
            missing.append(n)
    return missing


def check_supported(graph: Graph) -> None:
    """Raises one UnsupportedOpError naming every unsupported op of the graph, each with a node and file:line."""
    missing = unsupported_nodes(graph)
    if not missing:
        return
    first = missing[0]
    err = UnsupportedOpError(first.op_type, first.name, first.where())
    listed = [f"{n.op_type!r} (node {n.name!r}, {n.where()})" for n in missing[:20]]
    more = f" and {len(missing) - 20} more" if len(missing) > 20 else ""
    types = sorted({n.op_type for n in missing})
    err.args = (f"{graph.path or 'model'}: {len(missing)} node(s) use ops the engine does not support "
                f"({', '.join(types)}): {'; '.join(listed)}{more}",)
    err.ops = types  # type: ignore[attr-defined]
    raise err
