"""TNN's HDRGuide (written by onnx2tnn; CpuHdrGuideLayerAcc, which x86 falls back to) -> Conv, Relu, Conv, Clip.

On a 3-channel NCHW input, per pixel: rgb' = ccm_weight (3x3) · rgb + ccm_bias; guide_c = Σ_i slopes[c, i] ·
max(rgb'_c - shifts[c, i], 0) over 4 knots per channel; out = clamp(projection_weight · guide + projection_bias,
0, 1), one channel. As canonical ops: a 1x1 Conv 3 -> 12 (row (c, i) = ccm row c, bias ccm_bias[c] - shifts[c, i]),
Relu, a 1x1 Conv 12 -> 1 (weight projection_weight[c] · slopes[c, i], bias projection_bias), Clip(0, 1): the same
sums, grouped differently (float32 rounding apart). TNN refuses inputs of other than 3 channels.
"""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import Ctx, f32
from engine.formats.tnn.lowering.registry import handles

_SIZES = {"ccm_weight": 9, "ccm_bias": 3, "shifts": 12, "slopes": 12, "projection_weight": 3, "projection_bias": 1}


@handles("HDRGuide")
def lower_hdr_guide(c: Ctx) -> None:
    if len(c.inputs) != 1:
        c.fail(f"takes one input, has {len(c.inputs)}")
    shape = c.shape(c.inputs[0])
    if shape is not None and (len(shape) != 4 or shape[1] != 3):
        c.fail(f"takes an (N, 3, H, W) input, got {shape} (TNN's layer refuses other channel counts)")
    r = {}
    for key, n in _SIZES.items():
        a = c.attr(key)
        if a.size != n:
            c.fail(f"resource {key} has {a.size} values, expected {n}")
        r[key] = np.asarray(a, np.float64).reshape(-1)
    ccm, shifts, slopes = r["ccm_weight"].reshape(3, 3), r["shifts"].reshape(3, 4), r["slopes"].reshape(3, 4)
    knots_w = np.repeat(ccm, 4, axis=0).reshape(12, 3, 1, 1)
    knots_b = (r["ccm_bias"][:, None] - shifts).reshape(12)
    mix_w = (r["projection_weight"][:, None] * slopes).reshape(1, 12, 1, 1)
    one = {"stride": (1, 1), "pads": (0, 0, 0, 0), "dilation": (1, 1), "groups": 1}
    knots = c.tmp("Conv", [c.inputs[0]], one | {"activation": "relu"}, {"weight": f32(knots_w), "bias": f32(knots_b)})
    guide = c.tmp("Conv", [knots], one, {"weight": f32(mix_w), "bias": f32(r["projection_bias"])})
    c.out("Clip", [guide], {"min": 0.0, "max": 1.0})
