"""TNN Pad, PadV2, Upsample and GridSample layers -> Pad, Resize and GridSample."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import Ctx
from engine.formats.tnn.lowering.layout import INT_MAX
from engine.formats.tnn.lowering.registry import handles
from engine.ops.resize import tnn_scaled_size

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


def upsample_size(c: Ctx, shape: tuple[int, ...] | None, size: tuple[int, int] | None,
                  scale: tuple[float, float] | None) -> tuple[int, int] | None:
    """The output (height, width) of an Upsample (its size, else the input's times its scales when the shape is
    known), refused with the layer's line past what TNN's C int dims hold: a height or width, or (shape known) the
    output's element count, above INT_MAX (a hostile size would otherwise fail as a bare MemoryError later)."""
    known = shape is not None and len(shape) == 4
    if size is None and not known:
        return None
    out = size or tuple(tnn_scaled_size(n, s) for n, s in zip(shape[2:], scale, strict=True))
    if max(out) > INT_MAX:
        c.fail(f"output size {out[0]}x{out[1]} (TNN's dims are C ints: at most {INT_MAX})")
    if known and min(out) > 0 and shape[0] * shape[1] * out[0] * out[1] > INT_MAX:
        c.fail(f"output {shape[0]}x{shape[1]}x{out[0]}x{out[1]}: more than {INT_MAX} elements (TNN's element "
               "counts are C ints)")
    return out


@handles("Upsample")
def lower_upsample(c: Ctx) -> None:
    """Params mode (1 nearest, 2 bilinear, 3 cubic), scale_h, scale_w, align_corners (0 when absent), then, when
    both are there, the output height and width, which win over the scales (UpsampleLayerInterpreter,
    source/tnn/interpreter/tnn/layer_interpreter/upsample_layer_interpreter.cc). A size below 1, "0 0" included,
    fails TNN's shape inference (DimsFunctionUtils::Upsample, source/tnn/utils/dims_function_utils.cc). A negative
    align_corners with no output size is chosen by UpsampleLayer::InferOutputShape (source/tnn/layer/
    upsample_layer.cc): 0 when both float32 scales are >= 1, else 1; with a size it stays negative, i.e. true
    where the accs cast it to bool (x86's nearest ignores it: source/tnn/device/x86/acc/x86_upsample_layer_acc.cc).
    Constant extra inputs replace the params as UpsampleLayer::FillLayerParamWithConstantResource does: the
    scales from input 1 (2 inputs) or 2 (3 inputs), the sizes from input 3 (4 inputs), the last two values each."""
    mode = {1: "nearest", 2: "bilinear", 3: "bicubic"}.get(c.i(0)) or c.unsupported(f"mode {c.i(0)}")
    sh, sw, align = np.float32(c.f(1, 0.0)), np.float32(c.f(2, 0.0)), c.i(3, 0)
    size = (c.i(4), c.i(5)) if len(c.args) >= 6 else None
    if len(c.inputs) > 4:
        c.fail(f"takes at most 4 inputs, has {len(c.inputs)}")
    if len(c.inputs) > 1:
        known = c.value_of(c.inputs[-1])
        if known is None:
            c.unsupported("with a run-time scale or size input")
        known = np.asarray(known).reshape(-1)
        if known.size and known.size < 2:
            c.fail(f"{'sizes' if len(c.inputs) == 4 else 'scales'} input with {known.size} value(s), TNN needs 2")
        if known.size and len(c.inputs) == 4:
            size = tuple(int(v) for v in known[-2:])
        elif known.size:
            sh, sw = (np.float32(v) for v in known[-2:])
    params = {"mode": mode, "coordinate": "tnn"}
    if size is not None:
        if size[0] <= 0 or size[1] <= 0:
            c.fail(f"output size {size[0]}x{size[1]} (TNN's shape inference refuses a size below 1)")
        params["size"] = size
    else:
        if align < 0:
            align = 0 if sh >= 1 and sw >= 1 else 1
        if not (sh > 0 and sw > 0):
            c.fail(f"scales {sh} x {sw} and no output size (TNN's shape inference refuses a size below 1)")
        params["scale"] = (float(sh), float(sw))
    upsample_size(c, c.shape(c.inputs[0]), size, params.get("scale"))
    params["align_corners"] = bool(align)
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
