"""TNN's QuantizedUpsample -> TnnQUpsample (engine/ops/quant_upsample.py, which says what TNN's x86 acc computes).

Params, as UpsampleLayerInterpreter reads them (source/tnn/interpreter/tnn/layer_interpreter/
upsample_layer_interpreter.cc): mode (1 nearest, 2 bilinear, 3 cubic), scale_h, scale_w, then align_corners
(0 when absent) and, when both are there, the output height and width, which then win over the scales
(DimsFunctionUtils::Upsample, source/tnn/utils/dims_function_utils.cc: a size or a rounded in * scale below 1 is
an error). A negative align_corners with no output size is chosen by UpsampleLayer::InferOutputShape
(source/tnn/layer/upsample_layer.cc): 0 when both scales are >= 1, else 1. TNN's x86 int8 path reads the two
blob scales per tensor or per channel and refuses cubic ("Not supported mode for x86 int8 upsample").

Refused here, naming the layer and its line: cubic and unknown modes; scale or size inputs (the int8 layer
would take them as int8 data); a blob other than 4-D of known shape; a blob scale with neither 1 nor one value
per channel (TNN would read past it); an output height, width or element count above INT_MAX (TNN's dims are C
ints: pad_resize.upsample_size); a non-finite blob scale or factor in_scale / out_scale (TNN's x86 acc is
built with -ffast-math, which assumes neither); and bilinear sizes whose weights are off the 1/128 grid (TNN's
float sums then round as its compiler chose).
"""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import Ctx
from engine.formats.tnn.lowering.pad_resize import upsample_size
from engine.formats.tnn.lowering.registry import handles_quantized
from engine.ops.quant_upsample import BILINEAR_GRID, exact_bilinear, factors

F32 = np.float32
MODES = {1: "nearest", 2: "bilinear"}


def _params(c: Ctx) -> dict:
    mode = c.i(0)
    if mode not in MODES:
        why = "cubic: TNN's x86 int8 upsample refuses it" if mode == 3 else "unknown to TNN"
        c.unsupported(f"int8 with mode {mode} ({why})")
    sh, sw = F32(c.f(1)), F32(c.f(2))
    align = c.i(3, 0)
    params = {"mode": MODES[mode]}
    if len(c.args) >= 6:
        oh, ow = c.i(4), c.i(5)
        if oh <= 0 or ow <= 0:
            c.fail(f"output size {oh}x{ow} (TNN's shape inference refuses a size below 1)")
        params["size"] = (oh, ow)
    else:
        if align < 0:  # UpsampleLayer::InferOutputShape chooses
            align = 0 if sw >= 1 and sh >= 1 else 1
        params["scale"] = (float(sh), float(sw))
    params["align_corners"] = bool(align)
    return params


@handles_quantized("QuantizedUpsample")
def lower_qupsample(c: Ctx) -> None:
    params = _params(c)
    if len(c.inputs) != 1:
        c.unsupported("int8 with scale or size inputs (the int8 layer would read them as int8 data)")
    shape = c.shape(c.inputs[0])
    if shape is None or len(shape) != 4:
        c.unsupported(f"int8 on a {shape} blob (TNN's int8 upsample walks 4-D NCHW blobs of known size)")
    n_c = shape[1]
    scales = {}
    for role, v in (("input", c.inputs[0]), ("output", c.outputs[0])):
        s = c.low.blob_scale(v, c.node)
        if not np.all(np.isfinite(s)):
            c.unsupported(f"int8 with a non-finite {role} scale (TNN's x86 acc is built with -ffast-math)")
        if s.size not in (1, n_c):
            c.unsupported(f"int8 with {s.size} {role} scale(s) for {n_c} channels (TNN reads one, or one per "
                          "channel)")
        scales[role] = s
    f, _ = factors(scales["input"], scales["output"], n_c)
    if not np.all(np.isfinite(f)):
        c.unsupported("int8 with a non-finite input / output scale factor (TNN's -ffast-math leaves it undefined)")
    out = upsample_size(c, shape, params.get("size"), params.get("scale"))
    if min(out) <= 0:
        c.fail(f"scales {params['scale']} make a {out[0]}x{out[1]} output (TNN refuses a size below 1)")
    if params["mode"] == "bilinear":
        for axis, n_in, n_out in (("height", shape[2], out[0]), ("width", shape[3], out[1])):
            if not exact_bilinear(n_in, n_out, params["align_corners"]):
                c.unsupported(f"int8 bilinear {axis} {n_in} -> {n_out} with align_corners "
                              f"{int(params['align_corners'])}: weights off the 1/{BILINEAR_GRID} grid, where "
                              "TNN's x86 float sums (-ffast-math, FMA) round as its compiler chose")
    attrs = {"in_scale": scales["input"].astype(F32), "out_scale": scales["output"].astype(F32)}
    c.out("TnnQUpsample", [c.inputs[0]], params, attrs)
