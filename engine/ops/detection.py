"""DetectionOutput: Caffe SSD's box decoding, per-class NMS and top-k, as TNN's CPU runtime computes it
(source/tnn/utils/bbox_util.cc and NaiveDetectionOutput in source/tnn/device/cpu/acc/compute/compute.cc).

Inputs: loc (N, P*L*4) (L = 1 when locations are shared by the classes, else num_classes), conf (N, P*C) (per
prior, its C class scores), priors (1, 2, P*4[, 1]): the prior boxes (xmin, ymin, xmax, ymax, normalised) then
their four variances. Output (1, 1, N*keep_top_k, 7): per kept box [image, label, score, xmin, ymin, xmax,
ymax], image by image, labels ascending, each label's boxes in NMS order (score descending). TNN shrinks its
output to the kept rows; outputs here have static shapes, so the rows past them hold -1 (image -1: Caffe SSD's
"no detection", which TNN writes itself when nothing is kept: one row [i, -1, ...] per image).

Arithmetic is float32 as in TNN; ties between equal scores keep the lower prior (TNN's std::stable_sort), and in
the keep_top_k cut, where TNN's std::sort leaves their order open, the lower label.
"""

from __future__ import annotations

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register

F32 = np.float32
CORNER, CENTER_SIZE, CORNER_SIZE = 1, 2, 3


def _geometry(node: Node, loc, conf, prior) -> tuple[int, int, int]:
    """(batch, priors, location classes); ShapeError when the three inputs do not fit the params."""
    p = node.params
    classes, share = int(p["num_classes"]), bool(p["share_location"])
    if len(prior) < 3 or prior[0] != 1 or prior[1] != 2 or prior[2] % 4:
        raise ShapeError(f"{node.where()}: DetectionOutput priors {prior} are not (1, 2, P*4, ...)")
    n, priors, loc_classes = loc[0], prior[2] // 4, 1 if share else classes
    if conf[0] != n or _flat(loc) != priors * loc_classes * 4 or _flat(conf) != priors * classes:
        raise ShapeError(f"{node.where()}: DetectionOutput loc {loc} and conf {conf} do not fit {priors} priors "
                         f"and {classes} classes")
    if int(p["keep_top_k"]) <= 0 or int(p["code_type"]) not in (CORNER, CENTER_SIZE, CORNER_SIZE):
        raise ShapeError(f"{node.where()}: DetectionOutput keep_top_k={p['keep_top_k']}, "
                         f"code_type={p['code_type']}")
    return n, priors, loc_classes


def _flat(shape) -> int:
    return int(np.prod(shape[1:], dtype=np.int64))


def _infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    n, _, _ = _geometry(node, *(i.shape for i in ins))
    return [TensorInfo((1, 1, n * int(node.params["keep_top_k"]), 7), F32)]


def decode(node: Node, loc: np.ndarray, prior: np.ndarray, var: np.ndarray) -> np.ndarray:
    """DecodeBBox for (P, 4) location predictions against (P, 4) priors and variances, in float32."""
    code, in_target = int(node.params["code_type"]), bool(node.params["variance_encoded_in_target"])
    v = np.ones_like(var) if in_target else var
    pw, ph = prior[:, 2] - prior[:, 0], prior[:, 3] - prior[:, 1]
    if code == CORNER:
        return prior + v * loc
    if code == CORNER_SIZE:
        scale = np.stack([pw, ph, pw, ph], axis=1)
        return prior + v * loc * scale
    cx, cy = (prior[:, 0] + prior[:, 2]) / F32(2), (prior[:, 1] + prior[:, 3]) / F32(2)
    dcx, dcy = v[:, 0] * loc[:, 0] * pw + cx, v[:, 1] * loc[:, 1] * ph + cy
    dw, dh = np.exp(v[:, 2] * loc[:, 2]) * pw, np.exp(v[:, 3] * loc[:, 3]) * ph
    return np.stack([dcx - dw / F32(2), dcy - dh / F32(2), dcx + dw / F32(2), dcy + dh / F32(2)], axis=1)


def _size(b: np.ndarray) -> np.ndarray:
    """BBoxSize (normalised): 0 for an invalid box."""
    w, h = b[..., 2] - b[..., 0], b[..., 3] - b[..., 1]
    return np.where((w < 0) | (h < 0), F32(0), w * h).astype(F32)


def _overlap(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """JaccardOverlap of one box with each of `boxes` (normalised coordinates)."""
    disjoint = ((boxes[:, 0] > box[2]) | (boxes[:, 2] < box[0]) | (boxes[:, 1] > box[3]) | (boxes[:, 3] < box[1]))
    iw = np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0])
    ih = np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1])
    inter = (iw * ih).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / (_size(box) + _size(boxes) - inter)
    return np.where(disjoint | (iw <= 0) | (ih <= 0), F32(0), iou).astype(F32)


def nms(node: Node, boxes: np.ndarray, scores: np.ndarray) -> list[int]:
    """ApplyNMSFast: scores above the threshold, best first (stable), at most top_k; a box is kept when it
    overlaps every kept one by at most the (eta-adapted) threshold."""
    p = node.params
    top_k, eta = int(p["top_k"]), F32(p["eta"])
    threshold = F32(p["nms_threshold"])
    candidates = np.flatnonzero(scores > F32(p["confidence_threshold"]))
    order = candidates[np.argsort(-scores[candidates], kind="stable")]
    if top_k > -1:
        order = order[:top_k]
    kept: list[int] = []
    for idx in order:
        if not kept or bool(np.all(_overlap(boxes[idx], boxes[kept]) <= threshold)):
            kept.append(int(idx))
            if eta < 1 and threshold > 0.5:
                threshold = F32(threshold * eta)
    return kept


def _image(node: Node, loc: np.ndarray, conf: np.ndarray, prior: np.ndarray, var: np.ndarray,
           loc_classes: int) -> list[tuple[int, int, float, np.ndarray]]:
    """(label, prior index, score, box) of one image's kept detections, in output order."""
    p = node.params
    classes, background = int(p["num_classes"]), int(p["background_label_id"])
    scores = conf.reshape(-1, classes)
    locs = loc.reshape(-1, loc_classes, 4)
    decoded = {c: decode(node, locs[:, c], prior, var) for c in range(loc_classes)}
    found: dict[int, list[int]] = {}
    for c in range(classes):
        if c != background:
            found[c] = nms(node, decoded[0 if loc_classes == 1 else c], scores[:, c])
    keep_top_k = int(p["keep_top_k"])
    if sum(len(v) for v in found.values()) > keep_top_k:
        pairs = [(scores[i, c], c, i) for c, idx in found.items() for i in idx]
        pairs.sort(key=lambda t: -t[0])  # stable: equal scores keep label, then NMS order
        found = {}
        for _, c, i in pairs[:keep_top_k]:
            found.setdefault(c, []).append(i)
    return [(c, i, float(scores[i, c]), decoded[0 if loc_classes == 1 else c][i])
            for c in sorted(found) for i in found[c]]


def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    loc, conf, prior = (np.asarray(a, F32) for a in arrays[:3])
    n, priors, loc_classes = _geometry(node, loc.shape, conf.shape, prior.shape)
    boxes, var = prior.reshape(2, priors, 4)
    keep = int(node.params["keep_top_k"])
    out = np.full((n * keep, 7), -1, F32)
    rows = [(i, *d) for i in range(n) for d in _image(node, loc[i].reshape(-1), conf[i].reshape(-1), boxes, var,
                                                      loc_classes)]
    if not rows:
        out[:n, 0] = np.arange(n)
    for r, (i, label, _, score, box) in enumerate(rows):
        out[r, :3], out[r, 3:] = (i, label, score), box
    return [out.reshape(1, 1, n * keep, 7)]


register(OpDef("DetectionOutput", _infer, reference, arity=(3, 3), float_inputs=(0, 1, 2)))
