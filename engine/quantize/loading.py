"""The float graph calibration runs: read and lowered as engine.load does, optimized without fusing activations
and residual adds into convolutions (each of those blobs gets its own scale in a TNN int8 model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.errors import EngineError
from engine.ir import Graph
from engine.passes.eliminate_noops import eliminate_noops
from engine.passes.fold_constants import fold_constants
from engine.passes.fuse_conv_bn import fuse_conv_bn
from engine.passes.infer_shapes import infer_shapes
from engine.passes.pipeline import run_pipeline
from engine.runtime.loading import check_supported, lower, read_graph

PASSES = [infer_shapes, fold_constants, eliminate_noops, fuse_conv_bn, infer_shapes]
INT8_OPS = {"TnnQuantize", "TnnDequantize", "TnnQConv", "TnnQInnerProduct", "TnnQAdd", "TnnQPool", "TnnQConcat",
            "TnnQRelu"}


def float_graph(path: str | Path) -> Graph:
    """The canonical float graph of a model file, activations unfused; refuses an int8 model."""
    graph = read_graph(path)
    check_supported(graph)
    for v in graph.inputs:
        if v.dtype is None:
            v.dtype = np.dtype(np.float32)
    graph = run_pipeline(lower(graph), PASSES)
    check_supported(graph)
    done = sorted({n.op_type for n in graph.nodes} & INT8_OPS)
    if done:
        raise EngineError(f"{path}: the model is quantized already ({', '.join(done)})")
    names = [v.name for v in graph.values()]
    if len(names) != len(set(names)):
        raise EngineError(f"{path}: value names are not unique; calibration reads blobs by name")
    return graph
