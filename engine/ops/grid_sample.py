"""GridSample: torch's F.grid_sample on NCHW (ONNX GridSample, 4-D): out[n, c, h, w] samples x[n, c] at the
normalized (x, y) pair grid[n, h, w] in [-1, 1].

Modes `bilinear` (four taps, each weighted by the opposite rectangle's area) and `nearest` (the tap at the
coordinate rounded half to even, as torch's nearbyint); padding `zeros` (taps outside the input read 0) and
`border` (coordinates clamped to the edge pixels). align_corners: -1 and 1 are the centres of the corner pixels
((v + 1) / 2 * (size - 1)), else their outer edges ((v + 1) * size - 1) / 2). torch's `reflection` padding and
`bicubic` mode are not this op.
"""

from __future__ import annotations

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register

MODES = ("bilinear", "nearest")
PADDINGS = ("zeros", "border")


def grid_params(node: Node) -> tuple[str, str, bool]:
    mode, padding = node.params.get("mode", "bilinear"), node.params.get("padding_mode", "zeros")
    if mode not in MODES or padding not in PADDINGS:
        raise ShapeError(f"{node.where()}: GridSample mode {mode!r} padding_mode {padding!r} (takes modes "
                         f"{', '.join(MODES)} and paddings {', '.join(PADDINGS)})")
    return mode, padding, bool(node.params.get("align_corners", False))


def _infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 2:
        raise ShapeError(f"{node.where()}: GridSample takes (x, grid), got {len(ins)} inputs")
    grid_params(node)
    x, grid = ins
    if len(x.shape) != 4 or len(grid.shape) != 4 or grid.shape[3] != 2 or grid.shape[0] != x.shape[0]:
        raise ShapeError(f"{node.where()}: GridSample takes x (N, C, H, W) and grid (N, H', W', 2), got {x.shape} "
                         f"and {grid.shape}")
    if np.dtype(grid.dtype).kind != "f":
        raise ShapeError(f"{node.where()}: GridSample grid must be floating point, got {np.dtype(grid.dtype)}")
    return [TensorInfo((x.shape[0], x.shape[1], grid.shape[1], grid.shape[2]), x.dtype)]


def source_coords(v: np.ndarray, size: int, align: bool, padding: str) -> np.ndarray:
    """A normalized coordinate as a pixel position, clamped to the edge pixels for `border`."""
    pos = (v + 1) / 2 * (size - 1) if align else ((v + 1) * size - 1) / 2
    return np.clip(pos, 0, size - 1) if padding == "border" else pos


def sample(node: Node, x: np.ndarray, grid: np.ndarray, compute: np.dtype) -> np.ndarray:
    """(N, C, H', W') samples of x, computed in `compute`: taps outside the input weigh 0."""
    mode, padding, align = grid_params(node)
    n, c, h, w = x.shape
    gx = source_coords(grid[..., 0].astype(compute), w, align, padding)
    gy = source_coords(grid[..., 1].astype(compute), h, align, padding)
    batch = np.arange(n)[:, None, None]
    xs = x.astype(compute, copy=False)

    def tap(iy: np.ndarray, ix: np.ndarray) -> np.ndarray:
        inside = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
        v = xs[batch, :, np.clip(iy, 0, h - 1), np.clip(ix, 0, w - 1)]  # (N, H', W', C)
        return np.where(inside[..., None], v, compute.type(0))

    if mode == "nearest":
        out = tap(np.rint(gy).astype(np.int64), np.rint(gx).astype(np.int64))
    else:
        x0, y0 = np.floor(gx), np.floor(gy)
        fx, fy = (gx - x0)[..., None], (gy - y0)[..., None]
        x0, y0 = x0.astype(np.int64), y0.astype(np.int64)
        out = (tap(y0, x0) * ((1 - fx) * (1 - fy)) + tap(y0, x0 + 1) * (fx * (1 - fy))
               + tap(y0 + 1, x0) * ((1 - fx) * fy) + tap(y0 + 1, x0 + 1) * (fx * fy))
    return np.moveaxis(out, 3, 1)


def grid_sample_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x, grid = np.asarray(arrays[0]), np.asarray(arrays[1])
    return [sample(node, x, grid, np.dtype(np.float64)).astype(x.dtype)]


register(OpDef("GridSample", _infer, grid_sample_reference, arity=(2, 2), float_inputs=(0, 1)))
