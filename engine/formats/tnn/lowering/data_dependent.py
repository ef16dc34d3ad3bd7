"""TNN's NonZero and NonMaxSuppression -> NonZero, NonMaxSuppression (engine/ops/data_dependent.py): the layers
whose output size depends on the data (TNN sizes them at run time, InferRuntimeOutputShape / the acc itself).

NonZero: no params (onnx2tnn writes none); CpuNonZeroLayerAcc counts an element non-zero when any of its bytes is
(so -0.0 counts) and writes int32 indices (rank, count).
NonMaxSuppression: params `center_point_box max_output_boxes_per_class iou_threshold score_threshold`
(NonMaxSuppressionLayerInterpreter, defaults 0, 0, 0.0, 0.0; onnx2tnn moves ONNX's optional inputs 2..4 into
them and keeps inputs boxes and scores only). NaiveNonMaxSuppression always filters scores by `>
score_threshold` and writes int32 rows (batch, class, box). TNN's layer sizes its output (min(max_output_boxes_per_
class, boxes), 3), too small for several batches or classes: the engine's bound holds every row the acc writes.
"""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import Ctx
from engine.formats.tnn.lowering.registry import handles


@handles("NonZero")
def lower_nonzero(c: Ctx) -> None:
    if len(c.inputs) != 1:
        c.fail(f"has {len(c.inputs)} inputs (takes one)")
    c.out("NonZero", [c.inputs[0]], {"zero": "bits", "dtype": "int32"})


@handles("NonMaxSuppression")
def lower_non_max_suppression(c: Ctx) -> None:
    center, per_class, iou, score = c.i(0, 0), c.i(1, 0), c.f(2, 0.0), c.f(3, 0.0)
    if len(c.inputs) < 2:
        c.fail(f"has {len(c.inputs)} inputs (takes boxes and scores)")
    if center not in (0, 1):
        c.unsupported(f"with center_point_box {center} (TNN knows 0 corners, 1 center and size)")
    for v in c.inputs[:2]:
        info = c.low.info(v)
        if info is not None and np.dtype(info.dtype) != np.float32:
            c.unsupported(f"of {np.dtype(info.dtype)} {v.name!r} (TNN's acc reads float32 boxes and scores)")
    params = {"center_point_box": center, "max_output_boxes_per_class": per_class, "iou_threshold": iou,
              "score_threshold": score, "dtype": "int32"}
    c.out("NonMaxSuppression", list(c.inputs[:2]), params)
