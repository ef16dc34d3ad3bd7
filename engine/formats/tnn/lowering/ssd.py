"""TNN's Caffe-SSD layers: PriorBox (a constant) and DetectionOutput (the canonical op of engine/ops/detection.py).

`PriorBox` depends only on shapes (the feature map's H, W and the image's), so it lowers to a constant of TNN's
layout: (1, 2, H*W*num_priors*4, 1), the boxes (xmin, ymin, xmax, ymax, normalised, per cell then per prior:
each min size, then sqrt(min*max) when max sizes are given, then every aspect ratio other than 1) followed by
the variances. Proto params: n min_sizes, n max_sizes, clip, flip, n variances, n aspect_ratios (already
expanded with their flips by the converter), img_w, img_h, step_w, step_h, offset; zeros mean "from shapes".
"""

from __future__ import annotations

import math

import numpy as np

from engine.formats.tnn.lowering.context import Ctx
from engine.formats.tnn.lowering.registry import handles

F32 = np.float32
# At most this many boxes a PriorBox constant holds (SSD300 has 8732; 128 MiB of boxes and variances here): its cells
# come from the shapes the file declares, which a hostile file can make 65536 x 65536 (hundreds of GiB at load).
MAX_PRIOR_BOXES = 1 << 22


def _floats(c: Ctx, k: int) -> tuple[list[float], int]:
    n = c.i(k, 0)
    if n < 0 or k + 1 + n > len(c.args):
        c.fail(f"list at parameter {k} claims {n} values")
    return [c.f(k + 1 + j) for j in range(n)], k + 1 + n


def prior_box_params(c: Ctx) -> dict:
    mins, k = _floats(c, 0)
    maxs, k = _floats(c, k)
    clip, k = c.i(k, 0), k + 2  # flip (k + 1) only mattered to the converter, which expanded the ratios
    variances, k = _floats(c, k)
    ratios, k = _floats(c, k)
    img_w, img_h, step_w, step_h = (c.f(k + j, 0.0) for j in range(4))
    if maxs and len(maxs) != len(mins):
        c.fail(f"{len(maxs)} max sizes for {len(mins)} min sizes")
    if len(variances) not in (1, 4):
        c.fail(f"{len(variances)} variances (1 or 4 expected)")
    return {"min_sizes": mins, "max_sizes": maxs, "clip": bool(clip), "variances": variances,
            "aspect_ratios": ratios, "img": (img_h, img_w), "step": (step_h, step_w), "offset": c.f(k + 4, 0.5)}


def prior_boxes(p: dict, layer_hw: tuple[int, int], image_hw: tuple[int, int]) -> np.ndarray:
    """TNN's GeneratePriorBox in float32, vectorised over the cells."""
    lh, lw = layer_hw
    ih, iw = (p["img"] if p["img"][0] and p["img"][1] else image_hw)
    sh, sw = p["step"] if p["step"][0] and p["step"][1] else (F32(ih) / F32(lh), F32(iw) / F32(lw))
    ih, iw, sh, sw, off = F32(int(ih)), F32(int(iw)), F32(sh), F32(sw), F32(p["offset"])
    cy, cx = np.meshgrid((np.arange(lh, dtype=F32) + off) * sh, (np.arange(lw, dtype=F32) + off) * sw,
                         indexing="ij")
    sizes = []  # (box_w, box_h) per prior, in TNN's order
    for s, min_size in enumerate(p["min_sizes"]):
        m = int(min_size)
        sizes.append((F32(m), F32(m)))
        if p["max_sizes"]:
            side = F32(math.sqrt(F32(m * int(p["max_sizes"][s]))))
            sizes.append((side, side))
        for ar in p["aspect_ratios"]:
            if abs(ar - 1.0) < 1e-6:
                continue
            root = math.sqrt(F32(ar))  # C++ sqrt(float) promoted to double, then stored as float
            sizes.append((F32(m * root), F32(m / root)))
    half = np.array(sizes, F32).reshape(1, 1, -1, 2) / F32(2)
    cx, cy = cx[..., None], cy[..., None]
    boxes = np.stack([(cx - half[..., 0]) / iw, (cy - half[..., 1]) / ih,
                      (cx + half[..., 0]) / iw, (cy + half[..., 1]) / ih], axis=-1).astype(F32).reshape(-1)
    if p["clip"]:
        boxes = np.clip(boxes, F32(0), F32(1))
    variances = np.resize(np.asarray(p["variances"], F32), boxes.size)
    return np.stack([boxes, variances]).reshape(1, 2, -1, 1)


@handles("PriorBox")
def lower_prior_box(c: Ctx) -> None:
    shapes = [c.shape(v) for v in c.inputs[:2]]
    if len(shapes) < 2 or any(s is None or len(s) != 4 for s in shapes):
        c.unsupported("whose feature map or image shape is not known before running")
    params = prior_box_params(c)
    per_cell = len(params["min_sizes"]) * (1 + bool(params["max_sizes"]) + len(params["aspect_ratios"]))
    boxes = shapes[0][2] * shapes[0][3] * max(per_cell, 1)
    if boxes > MAX_PRIOR_BOXES:
        c.fail(f"{boxes} prior boxes ({shapes[0][2]} x {shapes[0][3]} cells), more than {MAX_PRIOR_BOXES}")
    priors = prior_boxes(params, shapes[0][2:], shapes[1][2:])
    c.alias(c.const(priors, "priors"))


@handles("DetectionOutput")
def lower_detection_output(c: Ctx) -> None:
    """Proto params (TNN's DetectionOutputLayerInterpreter): num_classes, share_location, background_label_id,
    variance_encoded_in_target, code_type, keep_top_k, confidence_threshold, nms_threshold, top_k, eta. TNN reads
    the fourth one inverted (0 means the variance is encoded in the target); its runtime is the reference, so it
    is read as TNN reads it."""
    if len(c.inputs) != 3:
        c.unsupported(f"with {len(c.inputs)} inputs (RefineDet's ARM inputs are not lowered; loc, conf, priors)")
    if len(c.args) > 10:
        c.fail(f"has {len(c.args)} parameters, DetectionOutput takes 10")
    params = {"num_classes": c.i(0), "share_location": bool(c.i(1)), "background_label_id": c.i(2),
              "variance_encoded_in_target": c.i(3) == 0, "code_type": c.i(4), "keep_top_k": c.i(5),
              "confidence_threshold": c.f(6), "nms_threshold": c.f(7), "top_k": c.i(8), "eta": c.f(9)}
    if params["num_classes"] <= 0 or params["keep_top_k"] <= 0:
        c.unsupported(f"num_classes={params['num_classes']}, keep_top_k={params['keep_top_k']} (the output's "
                      "rows are keep_top_k per image)")
    if params["code_type"] not in (1, 2, 3):
        c.fail(f"code_type {params['code_type']} (1 corner, 2 center-size, 3 corner-size)")
    c.out("DetectionOutput", list(c.inputs), params)
