"""CPU kernels of the ops whose output size depends on the data (engine/ops/data_dependent.py): NonZero and
NonMaxSuppression. Each writes its result C-contiguous at the actual shape into the front of its output slot
(planned at the upper bound) and returns the actual shapes (engine/runtime/extents.py)."""

from __future__ import annotations

import numpy as np

from engine.devices.cpu.kernel import Backends, CpuKernel
from engine.ir import Node
from engine.ops.data_dependent import F32, index_dtype, nms_params, nonzero_mask
from engine.ops.registry import TensorInfo


def _build_nonzero(backends: Backends, node: Node, ins: list[TensorInfo]):
    def run(inputs, outputs, workspace):
        x = inputs[0]
        flat = np.flatnonzero(nonzero_mask(node, x))
        k, out = flat.size, outputs[0].reshape(-1)
        for d, index in enumerate(np.unravel_index(flat, x.shape)):
            out[d * k:(d + 1) * k] = index
        return [(x.ndim, k)]
    return run


def _corners(boxes: np.ndarray, center_point_box: int) -> tuple[np.ndarray, ...]:
    """(x_min, y_min, x_max, y_max) columns of float32 boxes (N, 4), as TNN's SuppressByIOU derives them."""
    if center_point_box:
        half_w, half_h = boxes[:, 2] / F32(2), boxes[:, 3] / F32(2)
        return boxes[:, 0] - half_w, boxes[:, 1] - half_h, boxes[:, 0] + half_w, boxes[:, 1] + half_h
    return (np.minimum(boxes[:, 1], boxes[:, 3]), np.minimum(boxes[:, 0], boxes[:, 2]),
            np.maximum(boxes[:, 1], boxes[:, 3]), np.maximum(boxes[:, 0], boxes[:, 2]))


def _select(corners: tuple[np.ndarray, ...], order: np.ndarray, limit: int, iou: np.float32) -> list[int]:
    """Greedy NMS over the candidates in `order`: each one kept unless a kept box overlaps it by IoU > iou."""
    x0, y0, x1, y1 = corners
    area = (x1 - x0) * (y1 - y0)
    kept: list[int] = []
    for i in order:
        if len(kept) >= limit:
            break
        if kept:
            k = np.asarray(kept)
            ix0, ix1 = np.maximum(x0[i], x0[k]), np.minimum(x1[i], x1[k])
            iy0, iy1 = np.maximum(y0[i], y0[k]), np.minimum(y1[i], y1[k])
            inter = (ix1 - ix0) * (iy1 - iy0)
            union = area[i] + area[k] - inter
            with np.errstate(divide="ignore", invalid="ignore"):
                hit = ((ix1 > ix0) & (iy1 > iy0) & (inter > 0) & (area[i] > 0) & (area[k] > 0) & (union > 0)
                       & (inter / union > iou))
            if hit.any():
                continue
        kept.append(int(i))
    return kept


def _build_nms(backends: Backends, node: Node, ins: list[TensorInfo]):
    center, per_class, iou, threshold = nms_params(node)
    dtype = index_dtype(node)

    def run(inputs, outputs, workspace):
        boxes, scores = np.asarray(inputs[0], F32), np.asarray(inputs[1], F32)
        out, n = outputs[0].reshape(-1), 0
        for b in range(boxes.shape[0]):
            corners = _corners(boxes[b], center)
            for c in range(scores.shape[1]):
                s = scores[b, c]
                candidates = np.arange(s.size) if threshold is None else np.flatnonzero(s > threshold)
                order = candidates[np.argsort(-s[candidates], kind="stable")]  # ties: the lower box first
                for i in _select(corners, order, per_class, iou) if per_class > 0 else ():
                    out[3 * n:3 * n + 3] = np.array((b, c, i), dtype)
                    n += 1
        return [(n, 3)]
    return run


KERNELS = {"NonZero": CpuKernel(_build_nonzero), "NonMaxSuppression": CpuKernel(_build_nms)}
