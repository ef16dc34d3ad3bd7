"""TNN's RoiAlign -> RoiAlign (engine/ops/roi_align.py).

Params `mode output_height output_width sampling_ratio spatial_scale` (RoiAlignLayerInterpreter; mode 1 average,
0 max); inputs x, rois, batch_indices (CpuRoiAlignLayerAcc takes all three, reading the indices as int32).
TNN computes ONNX opset 10's RoiAlign: no half-pixel offset. onnx2tnn writes the layer without looking at
opset 16's coordinate_transformation_mode, so an `aligned` (half_pixel) ONNX RoiAlign already reaches TNN as this
one; the engine computes what TNN computes.
"""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import Ctx
from engine.formats.tnn.lowering.registry import handles


@handles("RoiAlign")
def lower_roi_align(c: Ctx) -> None:
    mode, oh, ow, ratio, scale = c.i(0, 1), c.i(1), c.i(2), c.i(3), c.f(4)
    if len(c.inputs) != 3:
        c.fail(f"has {len(c.inputs)} inputs (takes x, rois and batch indices)")
    if mode not in (0, 1):
        c.unsupported(f"with mode {mode} (TNN knows 0 max, 1 average)")
    if oh <= 0 or ow <= 0 or ratio < 0:
        c.fail(f"output {oh}x{ow}, sampling_ratio {ratio}")
    idx = c.low.info(c.inputs[2])
    if idx is not None and np.dtype(idx.dtype).kind not in "iu":
        c.unsupported(f"with {np.dtype(idx.dtype)} batch indices (TNN's acc reads them as int32)")
    params = {"mode": ("max", "avg")[mode], "output_height": oh, "output_width": ow, "sampling_ratio": ratio,
              "spatial_scale": scale}
    c.out("RoiAlign", list(c.inputs), params)
