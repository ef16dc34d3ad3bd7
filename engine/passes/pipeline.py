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
    "pnnx": ("engine.passes.lower_pnnx", "lower_pnnx"),
    "tnn": ("engine.passes.lower_tnn", "lower_tnn"),
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
    return getattr(importlib.import_module(module), name)(graph)


def run_pipeline(graph: Graph, passes: list[Pass] | None = None) -> Graph:
    """Lower, then every pass in order, then drop dead nodes and check the result."""
    graph = lower_graph(graph)
    for p in PIPELINE if passes is None else passes:
        graph = p(graph)
    graph.remove_dead()
    graph.validate()
    return graph
