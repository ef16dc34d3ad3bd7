"""Ops whose output size depends on their input's values: NonZero and NonMaxSuppression.

`infer` gives each output's upper bound (the arena reserves it; `OpDef.extent_dims` names the dim that is only a
bound); a kernel writes the actual result into the front of that slot, C-contiguous at the actual shape, and
returns the actual shapes (engine/runtime/extents.py carries them downstream).

NonZero (x, any rank >= 1): params `zero` (`value`: an element is non-zero when it compares unequal to 0, as in
ONNX and torch; `bits`: when any of its bytes is non-zero, as TNN's CpuNonZeroLayerAcc tests it, so -0.0 counts)
and `dtype` (`int64`; `int32` as TNN writes). Output (rank, count): the indices of the non-zero elements in C
order; bound (rank, x.size).

NonMaxSuppression (boxes (B, N, 4) float, scores (B, C, N) float): params center_point_box (0: corners
[y1, x1, y2, x2] in either order; 1: [x_center, y_center, width, height]), max_output_boxes_per_class,
iou_threshold, score_threshold (None: no filter; else only scores > it are candidates), `dtype` (`int64`;
`int32` as TNN writes). Per batch, per class, greedily the best-scoring candidate (the lower box index on a tie)
not suppressed by one already kept (IoU > iou_threshold; a box of zero area suppresses nothing), at most
max_output_boxes_per_class of them. Output (kept, 3) rows [batch, class, box], batch by batch, class by class,
in the order kept: ONNX's NonMaxSuppression as ONNX Runtime and TNN's NaiveNonMaxSuppression compute it (float32
arithmetic). Bound: (min(B*C*max_output_boxes_per_class, B*C*N), 3).
"""

from __future__ import annotations

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import HOST_EVAL_MAX_ELEMENTS, elements

INDEX_DTYPES = ("int64", "int32")
F32 = np.float32


def index_dtype(node: Node) -> np.dtype:
    name = node.params.get("dtype", "int64")
    if name not in INDEX_DTYPES:
        raise ShapeError(f"{node.where()}: {node.op_type} dtype {name!r} is not one of {INDEX_DTYPES}")
    return np.dtype(name)


# -- NonZero --------------------------------------------------------------------------------------------------
def nonzero_mask(node: Node, x: np.ndarray) -> np.ndarray:
    """Which elements count as non-zero (see the module doc)."""
    x = np.ascontiguousarray(x)
    if node.params.get("zero", "value") == "bits" and x.dtype.itemsize in (1, 2, 4, 8):
        return x.view(f"u{x.dtype.itemsize}") != 0
    return x != 0


def _nonzero_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    x = ins[0]
    if node.params.get("zero", "value") not in ("value", "bits"):
        raise ShapeError(f"{node.where()}: NonZero zero={node.params['zero']!r} is not 'value' or 'bits'")
    if not x.shape:
        raise ShapeError(f"{node.where()}: NonZero of a 0-d tensor (torch and ONNX disagree on its shape)")
    dtype = index_dtype(node)
    if x.value is not None and np.size(x.value) <= HOST_EVAL_MAX_ELEMENTS:  # known at load: its actual result
        value = _nonzero_reference(node, [np.asarray(x.value)])[0]
        return [TensorInfo(value.shape, dtype, value)]
    return [TensorInfo((len(x.shape), elements(x.shape)), dtype)]


def _nonzero_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    return [np.stack(np.nonzero(nonzero_mask(node, x))).astype(index_dtype(node)).reshape(x.ndim, -1)]


# -- NonMaxSuppression ----------------------------------------------------------------------------------------
def nms_bound(node: Node, boxes: tuple[int, ...], scores: tuple[int, ...]) -> int:
    batch, n, classes = boxes[0], boxes[1], scores[1]
    per_class = max(int(node.params.get("max_output_boxes_per_class", 0)), 0)
    return batch * classes * min(per_class, n)


def _nms_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    boxes, scores = ins
    if len(boxes.shape) != 3 or boxes.shape[2] != 4 or len(scores.shape) != 3 \
            or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ShapeError(f"{node.where()}: NonMaxSuppression takes boxes (B, N, 4) and scores (B, C, N), got "
                         f"{boxes.shape} and {scores.shape}")
    if int(node.params.get("center_point_box", 0)) not in (0, 1):
        raise ShapeError(f"{node.where()}: NonMaxSuppression center_point_box must be 0 or 1, got "
                         f"{node.params['center_point_box']}")
    return [TensorInfo((nms_bound(node, boxes.shape, scores.shape), 3), index_dtype(node))]


def corners(box: np.ndarray, center_point_box: int) -> tuple:
    """(x_min, y_min, x_max, y_max) of one float32 box, as TNN's SuppressByIOU derives them."""
    if center_point_box:
        xc, yc, w, h = box
        return xc - w / F32(2), yc - h / F32(2), xc + w / F32(2), yc + h / F32(2)
    y1, x1, y2, x2 = box
    return min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2)


def suppresses(a: np.ndarray, b: np.ndarray, center_point_box: int, iou_threshold: np.float32) -> bool:
    """Whether kept box `b` suppresses box `a` (TNN's SuppressByIOU, float32)."""
    ax0, ay0, ax1, ay1 = corners(a, center_point_box)
    bx0, by0, bx1, by1 = corners(b, center_point_box)
    ix0, ix1, iy0, iy1 = max(ax0, bx0), min(ax1, bx1), max(ay0, by0), min(ay1, by1)
    if ix1 <= ix0 or iy1 <= iy0:
        return False
    inter = (ix1 - ix0) * (iy1 - iy0)
    area_a, area_b = (ax1 - ax0) * (ay1 - ay0), (bx1 - bx0) * (by1 - by0)
    union = area_a + area_b - inter
    if inter <= 0 or area_a <= 0 or area_b <= 0 or union <= 0:
        return False
    return bool(inter / union > iou_threshold)


def nms_params(node: Node) -> tuple[int, int, np.float32, np.float32 | None]:
    p = node.params
    threshold = p.get("score_threshold")
    return (int(p.get("center_point_box", 0)), int(p.get("max_output_boxes_per_class", 0)),
            F32(p.get("iou_threshold", 0.0)), None if threshold is None else F32(threshold))


def _nms_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    boxes, scores = (np.asarray(a, F32) for a in arrays)
    center, per_class, iou, threshold = nms_params(node)
    rows = []
    for b in range(boxes.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[b, c]
            candidates = [i for i in range(s.size) if threshold is None or s[i] > threshold]
            candidates.sort(key=lambda i: (-s[i], i))
            kept: list[int] = []
            for i in candidates:
                if len(kept) >= per_class:
                    break
                if not any(suppresses(boxes[b, i], boxes[b, k], center, iou) for k in kept):
                    kept.append(i)
            rows += [(b, c, i) for i in kept]
    return [np.array(rows, dtype=index_dtype(node)).reshape(-1, 3)]


register(OpDef("NonZero", _nonzero_infer, _nonzero_reference, arity=(1, 1), extent_dims=(1,)),
         OpDef("NonMaxSuppression", _nms_infer, _nms_reference, arity=(2, 2), float_inputs=(0, 1),
               extent_dims=(0,)))
