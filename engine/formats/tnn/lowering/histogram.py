"""TNN's Histogram (written by onnx2tnn; CpuHistogramLayerAcc, which x86 falls back to) -> Histogram.

Param depth (HistogramLayerInterpreter; onnx2tnn writes -1 when the ONNX node gives none, which TNN turns into an
output of dims {-1}). The acc counts int32 bin indices into a (depth,) output and only logs an error for another
input type (leaving the zeros it wrote): both refused at load.
"""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import Ctx
from engine.formats.tnn.lowering.registry import handles


@handles("Histogram")
def lower_histogram(c: Ctx) -> None:
    depth = c.i(0, 0)
    if len(c.inputs) < 1:
        c.fail("has no input")
    if depth <= 0:
        c.unsupported(f"with depth {depth} (TNN's output would have {depth} elements)")
    info = c.low.info(c.inputs[0])
    if info is not None and np.dtype(info.dtype) != np.int32:
        c.unsupported(f"of a {np.dtype(info.dtype)} input (TNN's acc counts int32 indices only)")
    c.out("Histogram", [c.inputs[0]], {"depth": depth})
