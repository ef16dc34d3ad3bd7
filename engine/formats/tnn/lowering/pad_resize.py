"""TNN Pad, PadV2, Upsample and GridSample layers -> Pad, Resize and GridSample."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import Ctx
from engine.formats.tnn.lowering.registry import handles

PAD_MODES = {0: "constant", 1: "reflect", 2: "edge"}


@handles("Pad")
def lower_pad(c: Ctx) -> None:
    t, b, l, r, cb, ce = (c.i(k) for k in range(2, 8))
    mode = PAD_MODES.get(c.i(8, 0)) or c.unsupported(f"mode {c.i(8, 0)}")
    pads = [0, cb, t, l, 0, ce, b, r]
    shape = c.shape(c.inputs[0])
    if shape is not None and len(shape) == 5:
        pads = [0, cb, 0, t, l, 0, ce, 0, b, r]
    c.out("Pad", [c.inputs[0]], {"pads": pads, "mode": mode, "value": c.f(9, 0.0)})


@handles("PadV2")
def lower_padv2(c: Ctx) -> None:
    rank = c.i(0)
    pads = [c.i(1 + k) for k in range(2 * rank)]
    mode = PAD_MODES.get(c.i(1 + 2 * rank, 0)) or c.unsupported(f"mode {c.i(1 + 2 * rank, 0)}")
    c.out("Pad", [c.inputs[0]], {"pads": pads, "mode": mode, "value": c.f(2 + 2 * rank, 0.0)})


@handles("Upsample")
def lower_upsample(c: Ctx) -> None:
    mode = {1: "nearest", 2: "bilinear", 3: "bicubic"}.get(c.i(0)) or c.unsupported(f"mode {c.i(0)}")
    sh, sw, align = c.f(1, 0.0), c.f(2, 0.0), c.i(3, 0)
    oh, ow = c.i(4, 0), c.i(5, 0)
    params = {"mode": mode, "align_corners": bool(align), "coordinate": "tnn"}
    if len(c.inputs) > 1:
        known = c.value_of(c.inputs[-1])
        if known is None:
            c.unsupported("with a run-time size input")
        oh, ow = (int(v) for v in np.asarray(known).reshape(-1)[-2:])
    if oh > 0 and ow > 0:
        params["size"] = (oh, ow)
    elif sh > 0 and sw > 0:
        params["scale"] = (sh, sw)
    else:
        c.fail("neither an output size nor scales")
    c.out("Resize", [c.inputs[0]], params)


@handles("GridSample")
def lower_grid_sample(c: Ctx) -> None:
    """Params mode (2), pad_type (0), align_corners (0). TNN's only GridSample acc (CpuGridSampleLayerAcc) refuses
    all but mode 2 (bilinear), pad_type 0 (zeros), align_corners 0, on 4-D inputs: torch's grid_sample defaults."""
    mode, pad_type, align = c.i(0, 2), c.i(1, 0), c.i(2, 0)
    if (mode, pad_type, align) != (2, 0, 0):
        c.unsupported(f"with mode {mode}, pad_type {pad_type}, align_corners {align} (TNN's acc computes mode 2, "
                      "pad_type 0, align_corners 0 only)")
    if len(c.inputs) != 2:
        c.fail(f"takes (input, grid), got {len(c.inputs)} inputs")
    c.out("GridSample", list(c.inputs), {"mode": "bilinear", "padding_mode": "zeros", "align_corners": False})
