"""CPU kernels of the normalisations (engine/ops/norm.py): numba loops (statistics in float64) or broadcast
ufuncs."""

from __future__ import annotations

import math

import numpy as np

from engine.devices.cpu import threads as T
from engine.devices.cpu.fused_calls import Native, team_record
from engine.devices.cpu.kernel import Backends, CpuKernel, empty, numba_ok, reference_fallback
from engine.devices.cpu.loops import normalize as LN
from engine.devices.cpu.loops.normalize import groupnorm_loop, layernorm_rows
from engine.devices.cpu.onednn import objects as D
from engine.ir import Node
from engine.ops.norm import attr, channel_shape, eps_of, groups_of, lrn_window, reference
from engine.ops.registry import TensorInfo
from engine.ops.rules import float_of, norm_axis


def _vec(node: Node, name: str, dtype) -> tuple[np.ndarray, bool]:
    a = attr(node, name)
    if a is None:
        return np.zeros(1, dtype), False
    return np.ascontiguousarray(a.reshape(-1), dtype=dtype), True


def _batchnorm_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    dt = float_of(ins[0].dtype)
    cs = channel_shape(len(ins[0].shape))
    scale = np.ascontiguousarray(attr(node, "scale"), dtype=dt).reshape(cs)
    bias = np.ascontiguousarray(attr(node, "bias"), dtype=dt).reshape(cs)

    def run(inputs, outputs, workspace):
        out = outputs[0]
        np.multiply(inputs[0], scale, out=out, casting="unsafe")
        out += bias
    return run


def _layernorm_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    if np.dtype(ins[0].dtype) not in (np.float32, np.float64):
        return reference_fallback(node, reference)
    w, has_w = _vec(node, "weight", np.float64)
    b, has_b = _vec(node, "bias", np.float64)
    eps = eps_of(node)
    k = int(node.params.get("normalized_ndim", 1))
    dt, ot = ins[0].dtype, float_of(ins[0].dtype)
    layernorm_rows(empty(2, dt), empty(2, dt), False, empty(2, ot), w, b, eps, has_w, has_b, 0, 0)  # compile now
    LN.layernorm_team()  # its region function too (the float32 path's)

    eps_word = np.array([eps], np.float64)

    last = T.LastJob()

    def _layernorm_job(x: np.ndarray, out: np.ndarray) -> np.ndarray:
        n = math.prod(x.shape[x.ndim - k:])
        job = T.region_job(LN.LN_LEN)
        job[LN.LN_ROWS], job[LN.LN_N] = (x.size // n if n else 0), n
        job[LN.LN_X], job[LN.LN_OUT], job[LN.LN_WEIGHT], job[LN.LN_BIAS], job[LN.LN_EPS] = (
            D.address(a) for a in (x, out, w, b, eps_word))
        job[LN.LN_HAS_W], job[LN.LN_HAS_B] = has_w, has_b
        return job

    def teamable(x: np.ndarray, out: np.ndarray) -> bool:
        return (x.dtype == out.dtype == np.float32 and x.flags.c_contiguous and out.flags.c_contiguous
                and x.size == out.size)

    def run(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        n = math.prod(x.shape[x.ndim - k:])
        rows = x.size // n if n else 0
        # Rows split over the pool from MIN_WORK elements (~0.5 us per 1000, three vectorised passes: ~130 us):
        # below that the hand-over to a sleeping thread (20-100 us on a VM) costs what the split saves. (Counted
        # as 4 a element, MobileViT-XXS's 64K-element LayerNorms, ~30 us, were split and slower on 2 threads.)
        split = T.chunks_for(rows, x.size) > 1
        if teamable(x, out) and T.regions_callable() and (not split or T.native_regions()):
            # the cfunc a native program's record calls, for the same bits (threads.run_alone): its float64 sums
            # are reassociated per compilation, and the dispatcher's could round differently in the last bit
            job = last.get(x, out, lambda: _layernorm_job(x, out))
            if not split or not T.run_native(LN.layernorm_team().address, job):
                T.run_alone(LN.layernorm_team().address, job)
            return
        x2 = np.ascontiguousarray(x).reshape(rows, n)
        T.parallel_for(layernorm_rows, rows, x.size, x2, x2, False, out.reshape(rows, n), w, b, eps, has_w, has_b)

    def native(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        if not teamable(x, out):
            return None
        job = _layernorm_job(x, out)
        record = team_record(LN.layernorm_team().address, job, job[LN.LN_ROWS], x.size)
        return None if record is None else Native([record], [], [job, w, b, eps_word])

    run.native = native  # type: ignore[attr-defined]
    return run


def _groupnorm_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    if not numba_ok(ins[0].dtype):
        return reference_fallback(node, reference)
    w, has_w = _vec(node, "weight", np.float64)
    b, has_b = _vec(node, "bias", np.float64)
    eps = eps_of(node)
    groupnorm_loop(empty(3, ins[0].dtype), empty(3, float_of(ins[0].dtype)), 1, w, b, eps, has_w, has_b)

    def run(inputs, outputs, workspace):
        x = inputs[0]
        view = (x.shape[0], x.shape[1], -1)
        groupnorm_loop(np.ascontiguousarray(x).reshape(view), outputs[0].reshape(view), groups_of(node, x.shape[1]),
                       w, b, eps, has_w, has_b)
    return run


def _lp_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    # Rare op: the norm is a small reduced array, the division writes straight into the output.
    def run(inputs, outputs, workspace):
        x = inputs[0]
        axis = norm_axis(node, int(node.params.get("axis", 1)), x.ndim)
        if int(node.params.get("p", 2)) == 1:
            norm = np.sum(np.abs(x), axis=axis, keepdims=True)
        else:
            norm = np.linalg.norm(x, axis=axis, keepdims=True)
        np.maximum(norm, float(node.params.get("eps", 1e-12)), out=norm)
        np.divide(x, norm, out=outputs[0], casting="unsafe")
    return run


def _lrn_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    # Window sums as differences of a running sum over the channels (float64), not a loop per channel.
    def run(inputs, outputs, workspace):
        x = inputs[0]
        before, after, alpha, beta, bias = lrn_window(node, x.shape)
        c = x.shape[1]
        sq = np.square(x, dtype=np.float64)
        csum = np.zeros((x.shape[0], c + 1, *x.shape[2:]))
        np.cumsum(sq, axis=1, out=csum[:, 1:])
        hi = np.minimum(np.arange(c) + after + 1, c)
        lo = np.maximum(np.arange(c) - before, 0)
        window = csum[:, hi] - csum[:, lo]
        np.divide(x, (bias + alpha / (before + after + 1) * window) ** beta, out=outputs[0], casting="unsafe")
    return run


KERNELS = {
    "LRN": CpuKernel(_lrn_kernel),
    "BatchNorm": CpuKernel(_batchnorm_kernel),
    "LayerNorm": CpuKernel(_layernorm_kernel),
    "GroupNorm": CpuKernel(_groupnorm_kernel),
    "InstanceNorm": CpuKernel(_groupnorm_kernel),
    "LpNormalize": CpuKernel(_lp_kernel),
}
