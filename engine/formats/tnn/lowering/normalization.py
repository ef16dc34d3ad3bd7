"""TNN normalization layers -> BatchNorm (BatchNormCxx and Scale, which arrive folded), InstanceNorm, LayerNorm,
GroupNorm, LpNormalize (Normalize), LRN."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import F32, Ctx, f32
from engine.formats.tnn.lowering.registry import handles

# At most this many channels get values the file does not store (a missing scale or bias, or one shared by every
# channel): the count is the input's declared dim, which a hostile file can make 2**31 (an 8 GiB array at load).
MAX_FILLED_CHANNELS = 1 << 20


def _per_channel(c: Ctx, a: np.ndarray | None, fill: float) -> np.ndarray:
    channels = c.shape(c.inputs[0])
    n = channels[1] if channels and len(channels) > 1 else (a.size if a is not None and a.size else 1)
    if (a is None or a.size <= 1) and n > MAX_FILLED_CHANNELS:
        c.fail(f"{n} channels, more than the {MAX_FILLED_CHANNELS} a value not stored per channel is spread over")
    if a is None or a.size == 0:
        return np.full(n, fill, F32)
    return f32(np.broadcast_to(a.reshape(-1), (n,)) if a.size == 1 else a.reshape(-1))


@handles("BatchNormCxx", "BatchNormalization", "Scale")
def lower_batchnorm(c: Ctx) -> None:
    """BatchNormCxx and Scale: y = scale * x + bias per channel (BN arrives folded)."""
    scale = _per_channel(c, c.attr("scale"), 1.0)
    bias = _per_channel(c, c.attr("bias", required=False), 0.0)
    c.out("BatchNorm", [c.inputs[0]], {}, {"scale": scale, "bias": f32(np.broadcast_to(bias, scale.shape))})


@handles("InstBatchNormCxx")
def lower_instnorm(c: Ctx) -> None:
    attrs = {"weight": _per_channel(c, c.attr("scale", required=False), 1.0),
             "bias": _per_channel(c, c.attr("bias", required=False), 0.0)}
    c.out("InstanceNorm", [c.inputs[0]], {"eps": c.f(1, 1e-5)}, attrs)


def _const_input(c: Ctx, k: int) -> np.ndarray | None:
    if k >= len(c.inputs):
        return None
    data = c.value_of(c.inputs[k])
    if data is None:
        c.unsupported(f"with a non-constant input {k}")
    return f32(data)


@handles("LayerNorm")
def lower_layernorm(c: Ctx) -> None:
    attrs = {k: v for k, v in (("weight", _const_input(c, 1)), ("bias", _const_input(c, 2))) if v is not None}
    c.out("LayerNorm", [c.inputs[0]], {"normalized_ndim": c.i(0), "eps": c.f(1, 1e-5)}, attrs)


@handles("GroupNorm")
def lower_groupnorm(c: Ctx) -> None:
    attrs = {k: v for k, v in (("weight", _const_input(c, 1)), ("bias", _const_input(c, 2))) if v is not None}
    c.out("GroupNorm", [c.inputs[0]], {"num_groups": c.i(0), "eps": c.f(1, 1e-5)}, attrs)


@handles("Normalize")
def lower_normalize(c: Ctx) -> None:
    # TNN's CPU kernel: x / max(||x||_2, eps) or x / ||x||_1 over channels (axis 1) only
    if c.i(0, 0) or c.i(2, 0) or c.i(3, 1) != 1 or c.i(4, 2) not in (1, 2):
        c.unsupported("across spatial dims, with a shared channel, another axis or a p other than 1 or 2")
    c.out("LpNormalize", [c.inputs[0]], {"eps": c.f(1, 1e-12), "axis": c.i(3, 1), "p": c.i(4, 2)})


@handles("LRN")
def lower_lrn(c: Ctx) -> None:
    """Params alpha, beta, bias, size. TNN's CPU and x86 accs compute the window as c -/+ (size - 1) / 2 in integer
    arithmetic, which for an even size spans size - 1 channels where ONNX's LRN (what onnx2tnn converted) spans size:
    an even size is refused rather than answered one way or the other."""
    alpha, beta, bias, size = c.f(0), c.f(1), c.f(2), c.i(3)
    if size <= 0 or size % 2 == 0:
        c.fail(f"size={size}: TNN's LRN window and ONNX's differ for an even size (and a size must be positive)")
    c.out("LRN", [c.inputs[0]], {"size": size, "alpha": alpha, "beta": beta, "bias": bias})
