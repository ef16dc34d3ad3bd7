"""`RoiAlign`: ONNX's RoiAlign of opset 10 (coordinates without a half-pixel offset), as TNN's RoiAlign layer and
ONNX Runtime compute it.

Inputs x (N, C, H, W) float, rois (R, >= 4) float (x1, y1, x2, y2 in input coordinates; columns past the 4th are
ignored), batch_indices (R,) integer. Params mode `avg` / `max`, output_height, output_width, sampling_ratio,
spatial_scale. Output (R, C, output_height, output_width). Per ROI: the box times spatial_scale, its sides at
least 1, cut into output_height x output_width bins, each sampled on a grid of sampling_ratio² points (when 0,
ceil(side / bins) per side); a point is bilinear in x (clamped to the last row / column, 0 beyond one pixel
outside). `avg` averages the samples; `max` takes the max over samples of the max of the four weighted corner
terms (w·v, ONNX Runtime's and TNN's definition, not the max of the interpolated values).
"""

from __future__ import annotations

import math

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register

F32 = np.float32


def _check(node: Node, ins: list[TensorInfo]) -> tuple[int, int, int, int]:
    x, rois, idx = ins
    where = f"{node.where()}: RoiAlign"
    if len(x.shape) != 4:
        raise ShapeError(f"{where} takes an NCHW input, got {tuple(x.shape)}")
    if len(rois.shape) != 2 or rois.shape[1] < 4:
        raise ShapeError(f"{where} takes rois (R, >= 4), got {tuple(rois.shape)}")
    if tuple(idx.shape) != (rois.shape[0],) or np.dtype(idx.dtype).kind not in "iu":
        raise ShapeError(f"{where} takes ({rois.shape[0]},) integer batch indices, got {tuple(idx.shape)} "
                         f"{np.dtype(idx.dtype)}")
    if np.dtype(rois.dtype) != np.dtype(x.dtype):
        raise ShapeError(f"{where}: rois are {np.dtype(rois.dtype)}, the input {np.dtype(x.dtype)}")
    oh, ow = int(node.params["output_height"]), int(node.params["output_width"])
    if oh <= 0 or ow <= 0 or int(node.params.get("sampling_ratio", 0)) < 0:
        raise ShapeError(f"{where}: output {oh}x{ow}, sampling_ratio {node.params.get('sampling_ratio')}")
    if node.params.get("mode") not in ("avg", "max"):
        raise ShapeError(f"{where}: mode {node.params.get('mode')!r} is not avg or max")
    return rois.shape[0], x.shape[1], oh, ow


def infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo(_check(node, ins), ins[0].dtype)]


def _corners(v: float, size: int) -> tuple[int, int, float]:
    """(low, high, fraction) of a sample coordinate already inside [-1, size]."""
    v = max(v, 0.0)
    low = int(v)
    if low >= size - 1:
        return size - 1, size - 1, 0.0
    return low, low + 1, v - low


def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x, rois, idx = (np.asarray(a) for a in arrays)
    r_n, c_n, oh, ow = _check(node, [TensorInfo(a.shape, a.dtype) for a in (x, rois, idx)])
    h, w = x.shape[2:]
    scale, ratio, mode = float(node.params["spatial_scale"]), int(node.params.get("sampling_ratio", 0)), \
        node.params["mode"]
    out = np.zeros((r_n, c_n, oh, ow), np.float64)
    for r in range(r_n):
        b = int(idx[r])
        if not 0 <= b < x.shape[0]:
            raise ShapeError(f"{node.where()}: RoiAlign batch index {b} outside the input's {x.shape[0]}")
        x1, y1, x2, y2 = (float(v) * scale for v in rois[r, :4])
        rw, rh = max(x2 - x1, 1.0), max(y2 - y1, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = ratio or math.ceil(rh / oh)
        gw = ratio or math.ceil(rw / ow)
        img = x[b].astype(np.float64)
        for ph in range(oh):
            for pw in range(ow):
                vals = []
                for iy in range(gh):
                    yy = y1 + ph * bh + (iy + 0.5) * bh / gh
                    for ix in range(gw):
                        xx = x1 + pw * bw + (ix + 0.5) * bw / gw
                        if yy < -1.0 or yy > h or xx < -1.0 or xx > w:
                            vals.append(np.zeros((4, c_n)))
                            continue
                        y0, y_1, ly = _corners(yy, h)
                        x0, x_1, lx = _corners(xx, w)
                        vals.append(np.stack([(1 - ly) * (1 - lx) * img[:, y0, x0], (1 - ly) * lx * img[:, y0, x_1],
                                              ly * (1 - lx) * img[:, y_1, x0], ly * lx * img[:, y_1, x_1]]))
                terms = np.stack(vals)  # (samples, 4, C)
                out[r, :, ph, pw] = terms.sum(axis=1).mean(axis=0) if mode == "avg" else terms.max(axis=(0, 1))
    return [out.astype(x.dtype)]


register(OpDef("RoiAlign", infer, reference, arity=(3, 3), float_inputs=(0, 1)))
