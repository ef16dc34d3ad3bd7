"""Our fused activations (engine/ops/epilogue.py) as oneDNN eltwise post-ops, for the primitives that fuse them
(convolutions, matmul)."""

from __future__ import annotations

import numpy as np

_F32_MAX = float(np.finfo(np.float32).max)


def eltwise(name: str | None, params: dict | None) -> tuple[str, float, float] | None:
    """The oneDNN eltwise post-op (alg, alpha, beta) computing the same function as our activation `name`."""
    p = params or {}

    def get(key: str, default: float) -> float:
        v = p.get(key)
        return default if v is None else float(v)

    if name == "relu":
        return "relu", 0.0, 0.0
    if name == "leaky_relu":
        return "relu", get("alpha", 0.01), 0.0
    if name == "relu6":
        return "clip", 0.0, 6.0
    if name == "clip":
        return "clip", get("min", -_F32_MAX), get("max", _F32_MAX)
    if name == "sigmoid":
        return "logistic", 0.0, 0.0
    if name == "silu":
        return "swish", 1.0, 0.0
    if name == "tanh":
        return "tanh", 0.0, 0.0
    if name == "elu":
        return "elu", get("alpha", 1.0), 0.0
    if name in ("hardswish", "hardsigmoid"):
        return name, get("alpha", 1 / 6), get("beta", 0.5)
    if name == "gelu":
        return ("gelu_tanh" if p.get("approximate", "none") == "tanh" else "gelu_erf"), 0.0, 0.0
    return None
