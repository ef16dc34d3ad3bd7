"""The fused activation epilogue (engine/ops/epilogue.py) as the CPU kernels apply it, in place.

On C-contiguous float32/float64 outputs the transcendental activations run the activation family's numba loops
(one pass, no temporaries); anything else takes the numpy definition.
"""

from __future__ import annotations

import numpy as np

from engine.devices.cpu.loops import pointwise as mk
from engine.ops import epilogue as meaning


def _flat(out: np.ndarray) -> np.ndarray | None:
    """A 1-d view of `out` when a numba loop can run on it in place, else None."""
    if out.dtype in (np.float32, np.float64) and out.flags.c_contiguous:
        return out.reshape(-1)
    return None


def _leaky(out, p):
    if (f := _flat(out)) is not None:
        mk.leaky_relu_loop(f, f, meaning.param(p, "alpha", 0.01))
        return
    meaning.leaky_relu(out, p)


def _sigmoid(out, p):
    if (f := _flat(out)) is not None:
        mk.sigmoid_loop(f, f)
        return
    meaning.sigmoid(out, p)


def _silu(out, p):
    if (f := _flat(out)) is not None:
        mk.silu_loop(f, f)
        return
    s = out.copy()  # contiguous: its sigmoid takes the loop
    _sigmoid(s, p)
    out *= s


def _hardswish(out, p):
    if (f := _flat(out)) is not None:
        mk.hardswish_loop(f, f, meaning.param(p, "alpha", 1 / 6), meaning.param(p, "beta", 0.5))
        return
    meaning.hardswish(out, p)


def _gelu(out, p):
    if (f := _flat(out)) is not None:
        (mk.gelu_tanh_loop if p.get("approximate", "none") == "tanh" else mk.gelu_loop)(f, f)
        return
    meaning.gelu(out, p)


def _elu(out, p):
    if (f := _flat(out)) is not None:
        mk.elu_loop(f, f, meaning.param(p, "alpha", 1.0))
        return
    meaning.elu(out, p)


EPILOGUES = {**meaning.EPILOGUES, "leaky_relu": _leaky, "sigmoid": _sigmoid, "silu": _silu,
             "hardswish": _hardswish, "gelu": _gelu, "elu": _elu}


def apply_activation(name: str | None, params: dict | None, out: np.ndarray) -> None:
    """Applies activation `name` to `out` in place (no-op for None)."""
    if name is None:
        return
    EPILOGUES[name](out, params or {})
