"""NonZero and NonMaxSuppression CPU kernels against the numpy reference: each writes its result at the actual
shape into the front of the slot planned at the bound, and returns that shape."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import build_kernel, infer, infos_of, make_node, reference

RNG = np.random.default_rng(11)


def run_bounded(node, arrays: list[np.ndarray], max_arrays: list[np.ndarray] | None = None) -> np.ndarray:
    """The kernel built at `max_arrays`' shapes, run on `arrays` into a bound-sized slot full of garbage; the
    result read back at the shape the kernel returned."""
    (bound,) = infer(node, arrays)
    kernel, workspace = build_kernel(node, infos_of(max_arrays or arrays))
    slot = np.full(bound.shape, -7, bound.dtype)
    (shape,) = kernel(arrays, [slot], workspace)
    assert all(d <= b for d, b in zip(shape, bound.shape, strict=True))
    return slot.reshape(-1)[:int(np.prod(shape))].reshape(shape)


@pytest.mark.parametrize("params", [{}, {"zero": "bits", "dtype": "int32"}])
@pytest.mark.parametrize("shape, density", [((7,), 0.5), ((3, 4, 5), 0.3), ((2, 3), 0.0), ((4, 4), 1.0)])
def test_nonzero_kernel(params, shape, density):
    x = np.where(RNG.random(shape) < density, RNG.standard_normal(shape), 0).astype(np.float32)
    x.reshape(-1)[::5] *= -0.0  # signed zeros where x was 0, for the bit test
    node = make_node("NonZero", 1, params=params)
    got = run_bounded(node, [x], [np.zeros(tuple(d + 2 for d in shape), np.float32)])
    want = reference(node, [x])[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("threshold", [None, 0.3])
@pytest.mark.parametrize("per_class", [0, 1, 3, 50])
def test_nms_kernel(center, threshold, per_class):
    batch, classes, n = 2, 3, 40
    # boxes on a coarse grid and scores from few values: many overlaps and ties
    xy = RNG.integers(0, 8, (batch, n, 2)).astype(np.float32)
    wh = RNG.integers(0, 4, (batch, n, 2)).astype(np.float32)
    boxes = np.concatenate([xy, wh], -1) if center else np.concatenate([xy[..., ::-1], xy[..., ::-1] + wh], -1)
    scores = RNG.integers(0, 6, (batch, classes, n)).astype(np.float32) / 5
    node = make_node("NonMaxSuppression", 2, params={"center_point_box": center, "score_threshold": threshold,
                                                     "iou_threshold": 0.4, "max_output_boxes_per_class": per_class})
    got = run_bounded(node, [boxes, scores])
    np.testing.assert_array_equal(got, reference(node, [boxes, scores])[0])
    # below the max shapes the kernel built for
    small = [boxes[:1, :30].copy(), scores[:1, :2, :30].copy()]
    np.testing.assert_array_equal(run_bounded(node, small, [boxes, scores]), reference(node, small)[0])
