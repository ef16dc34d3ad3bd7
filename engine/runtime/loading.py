"""From a file on disk to an optimized canonical graph: pick the format by the file's suffix, read, lower, run the
device-neutral pass pipeline, and check that every remaining op is one the engine implements."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.errors import EngineError, UnsupportedOpError
from engine.formats.registry import FORMATS, format_of
from engine.ir import Graph, Node
from engine.ir.const_arrays import freeze_constants
from engine.ops.registry import all_ops
from engine.passes.pipeline import run_pipeline


def model_format(path: str | Path) -> str:
    fmt = format_of(path)
    if fmt is None:
        supported = ", ".join(sorted(f"MODEL{f.graph_suffix}" for f in FORMATS.values()))
        raise EngineError(f"{path}: unknown model file type; supported: {supported} (weights file beside it)")
    return fmt.name


def read_graph(path: str | Path) -> Graph:
    """The graph as the format reader builds it (format op names, not yet lowered)."""
    fmt = FORMATS[model_format(path)]
    if not Path(path).is_file():
        raise EngineError(f"{path}: no such model file")
    graph = fmt.read(str(path))
    graph.path = graph.path or str(path)
    graph.meta.setdefault("format", fmt.name)
    return graph


def lower(graph: Graph) -> Graph:
    """Maps format op names to canonical ops; a graph without a known format is taken as canonical."""
    name = graph.meta.get("format")
    if name is None or name == "canonical":
        return graph
    if name not in FORMATS:
        raise EngineError(f"{graph.path}: no lowering for format {name!r}; known: {', '.join(sorted(FORMATS))}")
    return FORMATS[name].lower(graph)


def prepare(graph: Graph) -> Graph:
    """Lowering and optimization passes; graph inputs without a dtype are taken as float32. The constants of the
    result are aligned and read-only (engine/ir/const_arrays.py)."""
    for v in graph.inputs:
        if v.dtype is None:
            v.dtype = np.dtype(np.float32)
    return freeze_constants(run_pipeline(lower(graph)))


def unsupported_nodes(graph: Graph) -> list[Node]:
    """Format ops no lowering handles (before lowering) and ops no kernel implements (after)."""
    ops = all_ops()
    fmt = graph.meta.get("format")
    prefix = f"{fmt}:"
    # lowerings stop at the first op they cannot handle: their op lists let the loader name every such op at once
    known = FORMATS[fmt].lowered_types if fmt in FORMATS else None
    missing = []
    for n in graph.nodes:
        if n.op_type.startswith(prefix):
            if known is not None and n.op_type[len(prefix):] not in known:
                missing.append(n)
        elif n.op_type not in ops:
            missing.append(n)
    return missing


def refusal_reason(graph: Graph, node: Node) -> str:
    """' (the format's reason)' for refusing the node's type, where it refuses it on purpose; else ''."""
    fmt = graph.meta.get("format")
    spec = FORMATS.get(fmt) if fmt else None
    reason = spec.refused.get(node.op_type[len(fmt) + 1:]) if spec and node.op_type.startswith(f"{fmt}:") else None
    return f" {reason}" if reason else ""


def check_supported(graph: Graph) -> None:
    """Raises one UnsupportedOpError naming every unsupported op of the graph, each with a node and file:line."""
    missing = unsupported_nodes(graph)
    if not missing:
        return
    first = missing[0]
    err = UnsupportedOpError(first.op_type, first.name, first.where())
    listed = [f"{n.op_type!r} (node {n.name!r}, {n.where()}){refusal_reason(graph, n)}" for n in missing[:20]]
    more = f" and {len(missing) - 20} more" if len(missing) > 20 else ""
    types = sorted({n.op_type for n in missing})
    err.args = (f"{graph.path or 'model'}: {len(missing)} node(s) use ops the engine does not support "
                f"({', '.join(types)}): {'; '.join(listed)}{more}",)
    err.ops = types  # type: ignore[attr-defined]
    raise err
