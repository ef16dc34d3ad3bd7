"""Our fused activations (engine/ops/epilogue.py) as oneDNN eltwise post-ops, for the primitives that fuse them
(convolutions, matmul), and as its eltwise primitive for the activation ops.

Convolutions and the activation ops leave sigmoid, SiLU and erf GELU to our own pass (`unless_ours`): oneDNN
computes them from exp and erf polynomials, ~0.8-1.2 ns an element on the AVX2 EPYC at one thread, fused or not,
where our rational approximations (devices/cpu/epilogue.py) take ~0.45-0.6 as a pass over the output, its memory
traffic included. Batch 8, in-process A/B on a loaded 2-core host: MobileViT-XXS (25 SiLU convolutions) 0.87x
the model's time at one thread, 0.90-0.95x at two; EfficientFormerV2-S0 (35 GELU convolutions) 0.88x and 0.95x.
Matmuls keep the post-ops: there the activation is a small share of the work and, on two threads, the extra
pass's hand-over and memory traffic outweighed it (Whisper-tiny's 1500x384x1536 GELU GEMM 15.7 ms fused, 18.0 as
a pass; DeiT-tiny's 1576x192x768 5.3 and 5.7; one thread: 13.6 and 13.1, 4.1 and 4.0).

Where oneDNN's convolutions work in 16-lane vectors (AVX-512: `native_block`), its erf GELU post-op is the faster
one (`conv_post_op`): in-process A/B on a 2-vCPU AVX-512 EPYC, GELU fused against our pass, EfficientFormerV2-S0
0.92-0.93x the model's time at batch 1 and 0.86x at batch 8 (its outputs within 1e-8 of each other; per element the
two differ by up to ~5 ulp, each within 1e-6 of the exact function over [-10, 10]). SiLU there is fused too
(oneDNN's swish): on a 2-vCPU AVX-512 Xeon, one process per setting, alternating, fused against our pass:
EfficientNet-B0 6.30-6.51 against 6.56-6.78 ms at batch 1 and 39-41 against 46 at batch 8, MobileViT-XXS 7.5-7.8
against 8.4-8.5 and 46 against 53 (our pass is one more trip over the output after each conv, whose second thread
the fused epilogue keeps busy: a 16->96 1x1 conv @112 with SiLU, two threads, 0.73 -> 0.47 ms). On the AVX-512
EPYC measured before, the pass had been ahead by 2-3% at most (MobileViT-XXS 0.98x at batch 1, 1.03x at batch 8,
fused against ours). NaN stays NaN either way (x * logistic(x)); -inf gives NaN as the reference does. oneDNN's
swish flushes results below ~1.4e-36 in magnitude to zero (x <= -87: -0, or +0 in a transposed conv's kernel,
where the reference gives -1.4e-36 at -87 and subnormals below): an underflow of the exp, no number a model reads.
"""

from __future__ import annotations

import numpy as np

from engine.devices.cpu.onednn.blocked import native_block

Eltwise = tuple[str, float, float]  # oneDNN's eltwise algorithm, alpha, beta

# A NaN must come out of a clamp as NaN (the reference's and torch's semantics): a ReLU that turned it into 0
# would hide a NaN the model computed behind a plausible number. oneDNN's relu with alpha 0, clip and hardsigmoid
# take max/min instructions that return the bound for a NaN, so the clamps are built from two steps that keep it:
# clip(-inf, hi) sends NaN to -inf (and only NaN and -inf go there), then hardswish(F32_MAX, 0), x * clip(F32_MAX *
# x, 0, 1), is x for every positive normal float and +inf, -0 for a finite negative, and -inf * 0 = NaN. Costs
# and limits: one more post-op (MobileNetV2's ReLU6 convolutions: 1.06x the model's time at batch 1, in-process A/B;
# oneDNN's elu(alpha 0), which also gets ReLU(-inf) = 0 right, computes exp and took 1.4x); a pre-activation of -inf
# (an infinite input or an overflow) comes out NaN where the reference gives the lower bound; a positive subnormal
# below 1 / F32_MAX (3e-39) comes out smaller (x * x * F32_MAX) where the reference keeps it; a negative gives -0.
# Hard-sigmoid, a clip whose lower bound is not 0 and leaky ReLU with alpha 0 have no such chain and run our pass
# (hard-sigmoid's alpha * x + beta step could overflow a finite x to -inf, which the clamp would make NaN).
_F32_MAX = float(np.finfo(np.float32).max)
_RELU: tuple[Eltwise, ...] = (("hardswish", _F32_MAX, 0.0),)


def _clamp_from_zero(hi: float | None) -> tuple[Eltwise, ...] | None:
    """min(max(x, 0), hi) keeping NaN (see above); None for hi < 0 (the reference's clip then gives hi)."""
    if hi is None or hi == np.inf:
        return _RELU
    if not hi >= 0:
        return None
    return (("clip", -np.inf, float(hi)),) + _RELU


def eltwise(name: str | None, params: dict | None) -> tuple[Eltwise, ...] | None:
    """The oneDNN eltwise post-ops, in order, that compute our activation `name` as its reference does, NaN
    included, within the limits above; None where none do (the caller applies our own pass after the primitive)."""
    p = params or {}

    def get(key: str, default: float) -> float:
        v = p.get(key)
        return default if v is None else float(v)

    if name == "relu":
        return _RELU
    if name == "leaky_relu":
        alpha = get("alpha", 0.01)  # alpha 0 is oneDNN's max(x, 0), which drops NaN (and the reference gives
        return (("relu", alpha, 0.0),) if alpha != 0 else None  # -inf * 0 = NaN there, not ReLU's 0)
    if name == "relu6":
        return _clamp_from_zero(6.0)
    if name == "clip":
        lo, hi = p.get("min"), p.get("max")
        if lo is None or lo == -np.inf:
            return () if hi is None or hi == np.inf else None
        return _clamp_from_zero(None if hi is None else float(hi)) if float(lo) == 0 else None
    if name == "hardsigmoid":  # our pass (see above)
        return None
    if name == "sigmoid":
        return (("logistic", 0.0, 0.0),)
    if name == "silu":
        return (("swish", 1.0, 0.0),)
    if name == "tanh":
        return (("tanh", 0.0, 0.0),)
    if name == "elu":
        return (("elu", get("alpha", 1.0), 0.0),)
    if name == "hardswish":
        return (("hardswish", get("alpha", 1 / 6), get("beta", 0.5)),)
    if name == "gelu":  # oneDNN's erf GELU gives NaN for +inf (the reference: inf) and overflows above ~1.7e38
        return ((("gelu_tanh" if p.get("approximate", "none") == "tanh" else "gelu_erf"), 0.0, 0.0),)
    return None


def ours(name: str | None, params: dict | None) -> bool:
    """Whether our own pass computes activation `name` faster than oneDNN's post-op or eltwise (see above)."""
    return name in ("sigmoid", "silu") or (name == "gelu" and (params or {}).get("approximate", "none") != "tanh")


def unless_ours(name: str | None, params: dict | None) -> tuple[Eltwise, ...] | None:
    """eltwise(name, params), or None where our own pass is faster (the caller applies it after the primitive)."""
    return None if ours(name, params) else eltwise(name, params)


def conv_post_op(name: str | None, params: dict | None) -> tuple[Eltwise, ...] | None:
    """The eltwise post-op a convolution fuses for activation `name`, or None where our pass after it is faster:
    unless_ours, but erf GELU and SiLU fused where oneDNN's convolutions work in 16-lane vectors (see above)."""
    if name in ("gelu", "silu") and native_block() >= 16:
        return eltwise(name, params)
    return unless_ours(name, params)
