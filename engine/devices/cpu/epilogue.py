"""The fused activation epilogue (engine/ops/epilogue.py) as the CPU kernels apply it, in place.

On C-contiguous float32/float64 outputs the transcendental activations run the activation family's numba loops (one
pass, no temporaries); anything else takes the numpy definition. Float32 sigmoid, SiLU and GELU (erf form) take
vectorised rational approximations (loops/pointwise.py), split over the engine's threads: oneDNN's convolutions and
the activation ops leave those three to this pass rather than fuse their post-ops, which cost twice as much per
element (onednn/eltwise.py; matmuls keep theirs, and convolutions fuse erf GELU where oneDNN works in 16 lanes). Where
OpenMP's threads spin through a request (threads.native_regions) a split pass is one native region
(pointwise.pass_team), no thread entering Python, and from far fewer elements (NATIVE_PASS_ELEMENTS): in-process at
batch 1 MobileViT-XXS 0.96x, EfficientFormerV2 0.986x (MobileViT-XXS at batch 8 0.992x with MIN_WORK's bound).
Float32 hard-sigmoid (a conv's or matmul's late activation: oneDNN's clamp would lose NaN) takes the same pass with
its own loop, the reference's numpy steps in float32 (its split bounds are the logistic's). Every such pass has
native_program records (`pass_records`).
"""

from __future__ import annotations

import numpy as np

from engine.devices.cpu import native_program as N
from engine.devices.cpu.loops import pointwise as mk
from engine.devices.cpu.threads import (
    chunks_for,
    get_threads,
    native_regions,
    parallel_for,
    region_job,
    region_record,
    run_native,
)
from engine.ops import epilogue as meaning

# parallel_for's work per element of the rational logistic: 1, so a pass splits from MIN_WORK (256K) elements up,
# where half of it (~60 us at ~0.5 ns an element) outweighs a hand-over; counted as multiply-adds (16), MobileViT-XXS
# at batch 1 on 2 threads forked for 16K-element passes and ran 1.15x slower
LOGISTIC_WORK = 1
# A native region (no thread enters Python, the team already spinning) costs a few microseconds, not a hand-over:
# it splits from here (~15 us of one thread's work). EfficientFormerV2's two GELUs over 1024x14x14 after its
# upsampling (200K elements, under MIN_WORK) ran 0.104 ms on one thread.
NATIVE_PASS_ELEMENTS = 1 << 15


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


def prepare() -> None:
    """Compiles (or loads from numba's cache) the passes' native region, so that the CPU device's start pays for it
    rather than the first request whose pass splits (any kernel may apply an activation after its work)."""
    mk.pass_team()


def _native_pass(kind: int, x: np.ndarray, out: np.ndarray, params: np.ndarray | None = None) -> bool:
    """The pass as one native region on OpenMP's team (pointwise.pass_team); False, nothing run, where it does not
    apply (the arrays not both 1-d contiguous float32 of one size, or the team busy)."""
    if not (x.dtype == out.dtype == np.float32 and x.ndim == out.ndim == 1 and x.size == out.size
            and x.flags.c_contiguous and out.flags.c_contiguous):
        return False
    return run_native(mk.pass_team().address, _pass_job(kind, x, out, params))


def _pass_job(kind: int, x: np.ndarray, out: np.ndarray, params: np.ndarray | None = None) -> np.ndarray:
    """pass_team's job for the pass `kind` over x into out (1-d float32 arrays of one size; x may be out); `params`,
    the pass's float32 parameters (hard-sigmoid's alpha and beta), must outlive the job's use."""
    job = region_job(mk.PASS_LEN)
    job[mk.PASS_KIND], job[mk.PASS_N], job[mk.PASS_X], job[mk.PASS_OUT] = kind, x.size, x.ctypes.data, out.ctypes.data
    job[mk.PASS_PARAMS] = 0 if params is None else params.ctypes.data
    return job


def _f32_pass(kind: int, inplace, ranged, x: np.ndarray, out: np.ndarray, params: np.ndarray | None = None) -> None:
    """One vectorised float32 loop over the engine's threads: the one-array form when x is out (LLVM's overlap check
    sends two arrays that are one buffer to the scalar loop), else the two-array one; a split one as a native region
    where OpenMP's threads spin. `params`: the loops' float32 parameters after the arrays (hard-sigmoid's)."""
    if x.size >= NATIVE_PASS_ELEMENTS and get_threads() > 1 and native_regions() and \
            _native_pass(kind, x, out, params):
        return
    extra = () if params is None else tuple(params)
    if x.ctypes.data == out.ctypes.data:
        parallel_for(inplace, x.size, x.size * LOGISTIC_WORK, out, *extra)
    else:
        parallel_for(ranged, x.size, x.size * LOGISTIC_WORK, x, out, *extra)


def _hardsigmoid_params(p: dict) -> np.ndarray:
    return np.array([meaning.param(p, "alpha", 1 / 6), meaning.param(p, "beta", 0.5)], np.float32)


def _hardsigmoid(out, p):
    """In float32 as the reference's numpy steps (x * alpha, + beta, clip: two roundings), by pass_team's loop."""
    if out.dtype == np.float32 and out.flags.c_contiguous:
        f = out.reshape(-1)
        _f32_pass(mk.PASS_HARDSIGMOID, mk.hardsigmoid_f32_inplace, mk.hardsigmoid_f32_range, f, f,
                  _hardsigmoid_params(p))
        return
    meaning.hardsigmoid(out, p)


def sigmoid_f32(x: np.ndarray, out: np.ndarray) -> None:
    """out = sigmoid(x) on 1-d contiguous float32 arrays (x may be out), over the engine's threads."""
    _f32_pass(mk.PASS_SIGMOID, mk.sigmoid_f32_inplace, mk.sigmoid_f32_range, x, out)


def silu_f32(x: np.ndarray, out: np.ndarray) -> None:
    """out = x * sigmoid(x) on 1-d contiguous float32 arrays (x may be out), over the engine's threads."""
    _f32_pass(mk.PASS_SILU, mk.silu_f32_inplace, mk.silu_f32_range, x, out)


def gelu_f32(x: np.ndarray, out: np.ndarray) -> None:
    """out = gelu(x) (erf form) on 1-d contiguous float32 arrays (x may be out), over the engine's threads."""
    _f32_pass(mk.PASS_GELU, mk.gelu_f32_inplace, mk.gelu_f32_range, x, out)


def _sigmoid(out, p):
    if (f := _flat(out)) is not None:
        (sigmoid_f32 if f.dtype == np.float32 else mk.sigmoid_loop)(f, f)
        return
    meaning.sigmoid(out, p)


def _silu(out, p):
    if (f := _flat(out)) is not None:
        (silu_f32 if f.dtype == np.float32 else mk.silu_loop)(f, f)
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
        if p.get("approximate", "none") == "tanh":
            mk.gelu_tanh_loop(f, f)
        else:
            (gelu_f32 if f.dtype == np.float32 else mk.gelu_loop)(f, f)
        return
    meaning.gelu(out, p)


def _elu(out, p):
    if (f := _flat(out)) is not None:
        mk.elu_loop(f, f, meaning.param(p, "alpha", 1.0))
        return
    meaning.elu(out, p)


EPILOGUES = {**meaning.EPILOGUES, "leaky_relu": _leaky, "sigmoid": _sigmoid, "silu": _silu,
             "hardswish": _hardswish, "gelu": _gelu, "elu": _elu, "hardsigmoid": _hardsigmoid}


_PASS_KINDS = {"sigmoid": mk.PASS_SIGMOID, "silu": mk.PASS_SILU, "hardsigmoid": mk.PASS_HARDSIGMOID}


def activation_records(name: str | None, params: dict | None, out: np.ndarray) -> tuple[list, list] | None:
    """What apply_activation(name, params, out) calls, as native_program records, and what they point into
    (jobs to keep alive); None where it would run Python: an activation other than float32 sigmoid, SiLU,
    hard-sigmoid and erf GELU on a contiguous array, or a pass parallel_for would split over Python callbacks."""
    if name is None:
        return [], []
    kind = _PASS_KINDS.get(name)
    if name == "gelu" and (params or {}).get("approximate", "none") != "tanh":
        kind = mk.PASS_GELU
    if kind is None or out.dtype != np.float32 or not out.flags.c_contiguous:
        return None
    return pass_records(kind, out, out, _hardsigmoid_params(params or {}) if kind == mk.PASS_HARDSIGMOID else None)


def pass_records(kind: int, x: np.ndarray, out: np.ndarray, params: np.ndarray | None = None) \
        -> tuple[list, list] | None:
    """_f32_pass(kind, ...) over x into out (contiguous float32 arrays of one size; x may be out) as native_program
    records and what they point into; None where it would split over Python callbacks."""
    n = out.size
    job = _pass_job(kind, x.reshape(-1), out.reshape(-1), params)
    keep = [job] if params is None else [job, params]
    if n >= NATIVE_PASS_ELEMENTS and get_threads() > 1 and native_regions():  # _f32_pass's native region
        record = region_record(mk.pass_team().address, job.ctypes.data)
        return None if record is None else ([record], keep)
    if chunks_for(n, n * LOGISTIC_WORK) > 1:
        return None
    # the loop on this thread, as parallel_for runs it whole: the region function outside a region is thread 0 of
    # 1, the same loop over every element
    return [(N.OP_CALL, mk.pass_team().address, job.ctypes.data)], keep


def apply_activation(name: str | None, params: dict | None, out: np.ndarray) -> None:
    """Applies activation `name` to `out` in place (no-op for None)."""
    if name is None:
        return
    EPILOGUES[name](out, params or {})
