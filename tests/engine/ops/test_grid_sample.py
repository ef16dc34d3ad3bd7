"""GridSample against torch's grid_sample written out pixel by pixel (aten/src/ATen/native/GridSampler.h:
grid_sampler_compute_source_index, the four bilinear taps, nearbyint for nearest), and the CPU kernel against it."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import check_kernel, infer, make_node, reference

from engine.errors import ShapeError


def torch_grid_sample(x, grid, mode, padding, align):
    n, c, h, w = x.shape
    out = np.zeros((n, c, *grid.shape[1:3]))

    def source(v, size):
        pos = (v + 1) / 2 * (size - 1) if align else ((v + 1) * size - 1) / 2
        return min(max(pos, 0), size - 1) if padding == "border" else pos

    def read(b, yy, xx):
        return x[b, :, yy, xx].astype(np.float64) if 0 <= yy < h and 0 <= xx < w else np.zeros(c)

    for b, i, j in np.ndindex(n, *grid.shape[1:3]):
        ix, iy = source(float(grid[b, i, j, 0]), w), source(float(grid[b, i, j, 1]), h)
        if mode == "nearest":
            out[b, :, i, j] = read(b, int(np.rint(iy)), int(np.rint(ix)))
            continue
        x0, y0 = int(np.floor(ix)), int(np.floor(iy))
        tx, ty = ix - x0, iy - y0
        out[b, :, i, j] = (read(b, y0, x0) * (1 - tx) * (1 - ty) + read(b, y0, x0 + 1) * tx * (1 - ty)
                           + read(b, y0 + 1, x0) * (1 - tx) * ty + read(b, y0 + 1, x0 + 1) * tx * ty)
    return out


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_is_torchs(mode, padding, align):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 4, 6)).astype(np.float32)
    grid = rng.uniform(-1.25, 1.25, (2, 5, 3, 2)).astype(np.float32)
    grid[0, 0, 0] = (0.5, -0.2)  # a half-way nearest tap on some sizes
    node = make_node("GridSample", 2, params={"mode": mode, "padding_mode": padding, "align_corners": align})
    (out,) = reference(node, [x, grid])
    assert out.shape == (2, 3, 5, 3) and out.dtype == np.float32
    np.testing.assert_allclose(out, torch_grid_sample(x, grid, mode, padding, align), rtol=1e-5, atol=1e-6)
    check_kernel(node, [x, grid], rtol=1e-5, atol=1e-5)


def test_grid_sample_refusals_name_the_node():
    x, grid = np.zeros((1, 2, 3, 3), np.float32), np.zeros((1, 2, 2, 2), np.float32)
    with pytest.raises(ShapeError, match="reflection"):
        infer(make_node("GridSample", 2, params={"padding_mode": "reflection"}), [x, grid])
    with pytest.raises(ShapeError, match="grid"):
        infer(make_node("GridSample", 2), [x, np.zeros((1, 2, 2, 3), np.float32)])
    with pytest.raises(ShapeError, match="floating"):
        infer(make_node("GridSample", 2), [x, np.zeros((1, 2, 2, 2), np.int32)])
