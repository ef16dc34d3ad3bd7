"""TNN's volumetric (NCDHW) layers -> Conv3d and Pool3d (engine/ops/volume.py); Deconvolution3D is refused in
lower.py (onnx2tnn writes it, but TNN's layer type map has no such type: TNN cannot load it).

Convolution3D (Conv3DLayerInterpreter): `group in out kd kh kw sd sh sw pd ph pw bias pad_type [dd dh dw] act`,
filter OIDHW (`in` per group), symmetric pads; CpuConv3DLayerAcc (NaiveConv3D, which x86 falls back to) then
applies the fused activation (0 none, 1 ReLU, 2 ReLU6, 256 x·sigmoid(x)).
Pooling3D (Pooling3DLayerInterpreter): `pool_type kd kh kw sd sh sw pd ph pw [kernel index d h w] pad_type
ceil_mode`; NaivePooling3D takes the max, or the average over the elements of the window inside the input.
TNN's SAME / VALID pads (pad_type 0 / 1; Pooling3D splits them with the height's stride on every axis) and kernel
sizes taken from input dims are refused.
"""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import Ctx, f32
from engine.formats.tnn.lowering.registry import handles
from engine.ops.volume import pool3d_out

_ACTIVATIONS = {0: None, 1: ("Relu", {}), 2: ("Clip", {"min": 0.0, "max": 6.0}), 256: ("Silu", {})}


def _five_d(c: Ctx) -> None:
    shape = c.shape(c.inputs[0])
    if shape is not None and len(shape) != 5:
        c.fail(f"takes an NCDHW input, got {len(shape)}-D {shape}")


@handles("Convolution3D")
def lower_conv3d(c: Ctx) -> None:
    g, ic, oc = c.i(0), c.i(1), c.i(2)
    k, s, p = [c.i(3 + j) for j in range(3)], [c.i(6 + j) for j in range(3)], [c.i(9 + j) for j in range(3)]
    has_bias, pad_type = c.i(12, 0), c.i(13, -1)
    dil, act = [c.i(14 + j, 1) for j in range(3)], c.i(17, 0)
    if pad_type != -1:
        c.unsupported(f"with pad_type {pad_type} (only explicit pads)")
    if act not in _ACTIVATIONS:
        c.unsupported(f"with fused activation type {act}")
    if min(g, ic, oc, *k, *s, *dil) <= 0 or min(p) < 0 or oc % g:
        c.fail(f"group={g} in={ic} out={oc} kernel={k} stride={s} pads={p} dilation={dil}")
    _five_d(c)
    w = c.weight("filter")
    if w.size != oc * ic * int(np.prod(k)):
        c.fail(f"filter has {w.size} values, the parameters need {(oc, ic, *k)}")
    attrs = {"weight": f32(w.reshape(oc, ic, *k))}
    bias = c.attr("bias", required=False)
    if has_bias and bias is not None and bias.size:
        if bias.size != oc:
            c.fail(f"bias has {bias.size} values, out={oc}")
        attrs["bias"] = f32(bias.reshape(oc))
    params = {"stride": s, "dilation": dil, "pads": [*p, *p], "groups": g}
    if _ACTIVATIONS[act] is None:
        return c.out("Conv3d", [c.inputs[0]], params, attrs)
    op, act_params = _ACTIVATIONS[act]
    c.out(op, [c.tmp("Conv3d", [c.inputs[0]], params, attrs)], act_params)


@handles("Pooling3D")
def lower_pooling3d(c: Ctx) -> None:
    ptype = c.i(0)
    k, s, p = [c.i(1 + j) for j in range(3)], [c.i(4 + j) for j in range(3)], [c.i(7 + j) for j in range(3)]
    # the kernel indexes are optional: the last two params are pad_type and ceil_mode
    rest = [c.i(j) for j in range(10, len(c.args))]
    if len(rest) not in (2, 5):
        c.fail(f"has {len(c.args)} params (expected 12, or 15 with kernel indexes)")
    kidx, (pad_type, ceil) = rest[:-2], rest[-2:]
    if ptype not in (0, 1):
        c.unsupported(f"pool_type {ptype}")
    if any(i != -1 for i in kidx):
        c.unsupported("with kernel sizes taken from input dims")
    if pad_type != -1:
        c.unsupported(f"with pad_type {pad_type} (only explicit pads)")
    if min(*k, *s) <= 0 or min(p) < 0:
        c.fail(f"kernel={k} stride={s} pads={p}")
    _five_d(c)
    shape = c.shape(c.inputs[0])
    if shape is not None:
        try:
            pool3d_out(shape[2:], k, s, [*p, *p], bool(ceil))
        except ValueError as e:  # TNN gives 0 (max) or 0/0 (average) there
            c.unsupported(f"on input {shape}: {e}")
    params = {"mode": ("max", "avg")[ptype], "kernel": k, "stride": s, "pads": [*p, *p], "ceil_mode": bool(ceil)}
    c.out("Pool3d", [c.inputs[0]], params)
