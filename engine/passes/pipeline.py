"""The one ordered, device-neutral pass pipeline every loaded graph goes through once the loader has lowered it
to canonical ops (each format's lowering lives in engine/formats/<format>/lowering). Shapes are annotated first
so shape-dependent rewrites can read them.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.ir import Graph
from engine.passes.eliminate_noops import eliminate_noops
from engine.passes.fold_constants import fold_constants
from engine.passes.fuse_attention import fuse_attention
from engine.passes.fuse_conv_bn import fuse_conv_bn
from engine.passes.fuse_conv_scale import fuse_conv_scale
from engine.passes.fuse_epilogue import fuse_epilogue
from engine.passes.infer_shapes import infer_shapes
from engine.passes.merge_extent_ops import merge_extent_ops
from engine.passes.merge_transposes import merge_transposes

Pass = Callable[[Graph], Graph]

PIPELINE: list[Pass] = [
    infer_shapes,
    fold_constants,
    merge_extent_ops,
    eliminate_noops,
    merge_transposes,
    fuse_attention,
    fuse_conv_bn,
    fuse_conv_scale,
    fuse_epilogue,
    infer_shapes,  # fusions moved outputs between nodes; refresh for `inspect` and the model's specs
]


def run_pipeline(graph: Graph, passes: list[Pass] | None = None) -> Graph:
    """Every pass in order on a canonical graph, then drop dead nodes and check the result."""
    for p in PIPELINE if passes is None else passes:
        graph = p(graph)
    graph.remove_dead()
    graph.validate()
    return graph
