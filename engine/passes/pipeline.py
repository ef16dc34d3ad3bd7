"""The one ordered pass pipeline every loaded graph goes through.

Lowering is chosen by graph.meta["format"] and imported lazily (each format's lowering lives in its own
module). After lowering, shapes are annotated so shape-dependent rewrites can read them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from engine.errors import EngineError
from engine.ir import Graph
from engine.passes.eliminate_noops import eliminate_noops
from engine.passes.fold_constants import fold_constants
from engine.passes.fuse_conv_bn import fuse_conv_bn
from engine.passes.fuse_epilogue import fuse_epilogue
from engine.passes.infer_shapes import infer_shapes

Pass = Callable[[Graph], Graph]

LOWERINGS: dict[str, tuple[str, str]] = {
    "pnnx": ("engine.formats.pnnx.lowering.lower", "lower_pnnx"),
    "tnn": ("engine.formats.tnn.lowering.lower", "lower_tnn"),
}
# Where each lowering keeps its handler tables (format op type without prefix -> handler).
_HANDLER_TABLES: dict[str, tuple[tuple[str, str], ...]] = {
    "pnnx": (("engine.formats.pnnx.lowering.lower", "HANDLED_TYPES"),),
    "tnn": (("engine.formats.tnn.lowering.lower", "HANDLED_TYPES"),),
}

PIPELINE: list[Pass] = [
    infer_shapes,
    fold_constants,
    eliminate_noops,
    fuse_conv_bn,
    fuse_epilogue,
    infer_shapes,  # fusions moved outputs between nodes; refresh for `inspect` and the model's specs
]


def lower_graph(graph: Graph) -> Graph:
    """Maps format op names to canonical ops; a graph without a known format is taken as canonical."""
    fmt = graph.meta.get("format")
    if fmt is None or fmt == "canonical":
        return graph
    if fmt not in LOWERINGS:
        raise EngineError(f"{graph.path}: no lowering for format {fmt!r}; known: {', '.join(LOWERINGS)}")
    module, name = LOWERINGS[fmt]
    try:
        lower = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise EngineError(f"{graph.path}: the {fmt} lowering is not available: {e}") from None
    return lower(graph)


def lowering_coverage(fmt: str | None) -> set[str] | None:
    """The format op types (without prefix) the format's lowering handles; None when that is unknown.

    Lowerings stop at the first op they cannot handle; this lets the loader name every such op at once.
    """
    tables = _HANDLER_TABLES.get(fmt or "")
    if not tables:
        return None
    known: set[str] = set()
    try:
        lowering = importlib.import_module(LOWERINGS[fmt][0])
        load_handlers = getattr(lowering, "_load_handlers", None)
        if load_handlers is not None:
            load_handlers()
        for module, name in tables:
            known |= set(getattr(importlib.import_module(module), name))
    except (ImportError, AttributeError):
        return None
    return known


def run_pipeline(graph: Graph, passes: list[Pass] | None = None) -> Graph:
    """Lower, then every pass in order, then drop dead nodes and check the result."""
    graph = lower_graph(graph)
    for p in PIPELINE if passes is None else passes:
        graph = p(graph)
    graph.remove_dead()
    graph.validate()
    return graph
