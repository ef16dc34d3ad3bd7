"""MaxPool / AvgPool on oneDNN, float32 NCHW in and out (no reorders), and MaxPoolBlocked on the same primitive
with nChw{B}c descriptors on both sides (its jit kernel is ~5x the numba loop over lanes). A plain MaxPool of a
wide window runs on the blocked primitive too, between two reorders (`build_via_blocked`, VIA_BLOCKED_MIN_TAPS).

torch's ceil_mode becomes extra end padding (oneDNN wants out = (in + pads - window) / stride + 1 exactly):
max pooling never reads padding, and AvgPool without count_include_pad divides by the window clipped to the
input, so both are exact. AvgPool with count_include_pad is exact only when that extra padding is zero (torch
clips its divisor at the declared pads), and divisor_override has no oneDNN counterpart: both keep the numba path.
"""

from __future__ import annotations

import logging

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu import native_program as N
from engine.devices.cpu.fused_calls import Native, step_native
from engine.devices.cpu.kernel import remember
from engine.devices.cpu.loops.pool import NF_FLAGS, NF_LEN, NF_N, NF_PARTS, NF_X, not_finite, not_finite_team
from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.onednn.blocked import blocked_md
from engine.devices.cpu.threads import (
    get_threads,
    native_regions,
    region_job,
    region_record,
    run_native,
    threads_for,
    work_of,
)
from engine.errors import KernelError
from engine.ir import Node
from engine.ops.registry import TensorInfo

log = logging.getLogger("engine.onednn")


def _end_pads(geo) -> tuple[int, int]:
    """Bottom and right pads that make oneDNN's output size torch's (ceil_mode widens them)."""
    (kh, kw), (sh, sw), (dh, dw) = geo.kernel, geo.stride, geo.dilation
    b = max(geo.pads[2], (geo.oh - 1) * sh + (kh - 1) * dh + 1 - geo.h - geo.pads[0])
    r = max(geo.pads[3], (geo.ow - 1) * sw + (kw - 1) * dw + 1 - geo.w - geo.pads[1])
    return b, r


def _sizes_match(geo) -> bool:
    """Whether oneDNN's output size, (in + pads - window) / stride + 1 with the end pads of `_end_pads`, is torch's:
    not where ceil_mode drops a last window that would start in the end padding and a declared end pad is at least
    the window (a 5x5 window with an end pad of 5), which oneDNN refuses to create."""
    (kh, kw), (sh, sw), (dh, dw) = geo.kernel, geo.stride, geo.dilation
    b, r = _end_pads(geo)
    return ((geo.h + geo.pads[0] + b - (kh - 1) * dh - 1) // sh + 1 == geo.oh
            and (geo.w + geo.pads[1] + r - (kw - 1) * dw - 1) // sw + 1 == geo.ow)


def algorithm(node: Node, geo) -> int | None:
    """The oneDNN pooling algorithm computing this node exactly at this geometry, or None."""
    if not _sizes_match(geo):
        return None
    if node.op_type == "MaxPool":
        return L.POOL_MAX
    if node.params.get("divisor_override"):
        return None
    if not node.params.get("count_include_pad", True) or not any(geo.pads):
        return L.POOL_AVG_EXCLUDE
    return L.POOL_AVG_INCLUDE if _end_pads(geo) == geo.pads[2:] else None


def supported(node: Node, ins: list[TensorInfo], geom) -> bool:
    """Whether oneDNN pools this node exactly (float32 NCHW); the caller checks oneDNN is on."""
    if np.dtype(ins[0].dtype) != np.float32 or len(ins[0].shape) != 4:
        return False
    return algorithm(node, geom(node, ins[0].shape)) is not None


def jit_pooling(impl: str) -> bool:
    """Whether oneDNN pools with a jit kernel: its "simple_nchw" loops (what AVX2 hosts get on NCHW) and its
    reference are slower than the numba kernels (AvgPool 3x3 s1 p1 192 @28: 3.3-4.3 ms simple_nchw, ~0.2 ms
    numba; 2x2 s2 256 @56: 3.3 ms)."""
    return impl.startswith("jit")


# A plain NCHW MaxPool of at least this many taps runs on the blocked primitive between two reorders
# (`build_via_blocked`).
# Measured against the numba loop at one thread on an AVX2 EPYC (ms, numba / reorder in + pool + reorder out):
# 5x5 s1 p2 256 @20 1.39 / 0.26, 128 @40 2.55 / 0.29, 512 @10 0.82 / 0.16; 13x13 s1 256 @20 2.94 / 0.46 (the numba
# loop's windows past three rows take a slow general path); at 9 taps or fewer the two are close or numba ahead:
# 3x3 s1 256 @20 0.20 / 0.17, 64 @56 0.12 / 0.18; 3x3 s2 128 @56 0.19 / 0.26; 2x2 s2 64 @112 0.55 / 0.42, 256 @28
# 0.20 / 0.15, 32 @160 0.47 / 0.48. Every result equal (a max reorders nothing). (The numba figures predate its
# one-pass 2x2 loop and unsigned row indices, loops/pool.py, which made its 2x2 s2 pools 2.4-4x faster and its
# 3x3 ones up to 1.4x: below the bound numba is now ahead.)
VIA_BLOCKED_MIN_TAPS = 10


def via_blocked_pays(node: Node, geo, block: int) -> bool:
    """Whether a plain MaxPool of this geometry runs faster on the blocked primitive between reorders (a dilated
    window has only oneDNN's reference kernel; a geometry oneDNN cannot pool exactly keeps the numba loop)."""
    return (node.op_type == "MaxPool" and block > 0 and geo.kernel[0] * geo.kernel[1] >= VIA_BLOCKED_MIN_TAPS
            and geo.dilation == (1, 1) and algorithm(node, geo) is not None)


def via_blocked_bytes(geo, block: int) -> int:
    """The workspace the reordered input and output take (nChw{block}c, channels padded to whole blocks)."""
    lanes = -(-geo.c // block) * block
    return sum(D.aligned(4 * geo.n * lanes * h * w) for h, w in ((geo.h, geo.w), (geo.oh, geo.ow))) + D.ALIGN


def _md(shape: tuple[int, ...], block: int) -> D.MemoryDesc:
    return blocked_md(shape, block) if block else D.MemoryDesc.plain(shape)


class _Plan:
    def __init__(self, node: Node, geo, block: int):
        alg = algorithm(node, geo)
        if alg is None:
            raise KernelError(f"{node.where()}: {node.op_type} at input {(geo.n, geo.c, geo.h, geo.w)} has no exact "
                              f"oneDNN pooling (count_include_pad with ceil_mode)")
        src = _md((geo.n, geo.c, geo.h, geo.w), block)
        dst = _md((geo.n, geo.c, geo.oh, geo.ow), block)
        attr = D.Attr()
        work = geo.n * geo.c * geo.oh * geo.ow * geo.kernel[0] * geo.kernel[1]
        # Created for the threads its work is worth, as convolutions are: a pooling created for two threads forks
        # both even when it runs under a count of one (GhostNet's squeeze-excite means: 7 -> 15 us at 2 threads).
        with D.creating(work):
            self.pd = D.PrimitiveDesc.create(
                "dnnl_pooling_forward_primitive_desc_create", D.engine(), L.FORWARD_INFERENCE, alg, src.h, dst.h,
                L.dims(geo.stride), L.dims(geo.kernel), L.dims(d - 1 for d in geo.dilation), L.dims(geo.pads[:2]),
                L.dims(_end_pads(geo)), attr.h)
            pad = self.pd.md(L.QUERY_SCRATCHPAD_MD)
            self.step = D.Step(D.Primitive(self.pd), {L.ARG_SRC: src, L.ARG_DST: dst, L.ARG_SCRATCHPAD: pad}, work)
        self.scratch = D.aligned_buffer(pad.nbytes) if pad.nbytes else None  # weights-like: once per shape
        self.impl = self.pd.impl

    def run(self, x: np.ndarray, out: np.ndarray, workspace: np.ndarray | None) -> None:
        D.run_src_dst(self.step, x, out, self.scratch)


def build(node: Node, ins: list[TensorInfo], geom, fallback: Kernel, block: int = 0, exact=None) -> Kernel:
    """`geom(node, shape)` is engine.ops.pool's pool_geom or, for blocked values
    (`block` > 0), the geometry with the lanes counted as channels; `fallback` runs the shapes oneDNN cannot do
    exactly (count_include_pad windows that ceil_mode widens only at some sizes, see also `_sizes_match`), a max
    pooling's inputs holding a NaN or an infinity (`not_finite`), and the whole node when oneDNN has no jit kernel
    for it (`jit_pooling`). A max pooling records into native programs where `exact(x, out, flags)` gives the record
    of the fallback's loop run where the NaN check's `flags` say so (and its job): check, pool, then that."""
    return _per_shape(node, ins, geom, fallback, lambda geo: _Plan(node, geo, block), "onednn:", exact)


def build_via_blocked(node: Node, ins: list[TensorInfo], geom, block: int, fallback: Kernel) -> Kernel:
    """A plain float32 MaxPool on the nChw{block}c primitive between two reorders (VIA_BLOCKED_MIN_TAPS says
    where that pays), `fallback` (the numba kernel) as in `build`. The reordered copies sit in the workspace
    (`via_blocked_bytes` at the max shape)."""
    return _per_shape(node, ins, geom, fallback, lambda geo: _ViaBlocked(node, geo, block), "onednn:reorder+")


def _per_shape(node: Node, ins: list[TensorInfo], geom, fallback: Kernel, make, label: str, exact=None) -> Kernel:
    """The kernel of `build` and `build_via_blocked`: a plan (`make(geometry)`: run(x, out, workspace) and its
    primitive's impl) per input shape, `fallback` where there is none."""
    D.sync_threads()
    geo = geom(node, ins[0].shape)
    if algorithm(node, geo) is None:
        return fallback
    first = make(geo)
    if not jit_pooling(first.impl):  # the reference or the simple loops: the numba kernel is the faster path
        log.debug("%s: oneDNN has only %s for %s, numba kernel", node.where(), first.impl, node.op_type)
        return fallback
    plans: dict[tuple, object] = {tuple(ins[0].shape): first}
    is_max = node.op_type == "MaxPool"
    if is_max:
        not_finite_team()  # compiled (or loaded) now, not in a request

    def run(inputs, outputs, workspace):
        x = np.ascontiguousarray(inputs[0])
        if x.shape in plans:
            plan = plans[x.shape]
        else:
            geo = geom(node, x.shape)
            plan = remember(plans, x.shape, make(geo) if algorithm(node, geo) is not None else None)
            log.debug("%s: oneDNN %s for input %s: %s", node.where(), node.op_type, x.shape,
                      plan.impl if plan else "none, numba kernel")
        if plan is None or (is_max and has_not_finite(x.reshape(-1))):  # oneDNN's max lets NaNs go (not_finite)
            fallback(inputs, outputs, workspace)
            return
        D.sync_threads()
        plan.run(x, outputs[0], workspace)

    def native(inputs, outputs, workspace):
        # a max pooling looks at the data first (not_finite): recorded only with its exact loop's record after it
        x, plan = inputs[0], plans.get(inputs[0].shape)
        if (is_max and (exact is None or x.dtype != np.float32)) or not isinstance(plan, _Plan) or (
                not x.flags.c_contiguous):
            return None
        ptrs = {L.ARG_SRC: D.address(x), L.ARG_DST: D.address(outputs[0])}
        if plan.scratch is not None:
            ptrs[L.ARG_SCRATCHPAD] = D.address(plan.scratch)
        pool = step_native(plan.step, ptrs, plan)
        if not is_max:
            return pool
        check, flags, job = _check_records(x.reshape(-1))
        fix, fix_job = exact(x, outputs[0], flags)
        return Native(check + pool.records + [fix], pool.checks, pool.keep + [flags, job, fix_job])

    run.native = native  # type: ignore[attr-defined]
    run.impl = label + first.impl  # type: ignore[attr-defined]
    run.plans = plans  # type: ignore[attr-defined]
    return run


def has_not_finite(x: np.ndarray) -> bool:
    """Whether the flat float array x holds a NaN or an infinity (loops.pool.not_finite): a float32 read worth
    splitting is split over OpenMP's team in a native region (a batch-8 pool input of 25 MB took 1.05 ms on one
    thread, half its pooling's time; SqueezeNet at batch 8 on 2 vCPUs, six alternating runs: median 24.3 against
    24.9 ms, batch 1 unchanged), else one thread reads it all."""
    if x.dtype != np.float32 or not native_regions() or threads_for(work_of(0, x.nbytes)) <= 1:
        return bool(not_finite(x))
    job, flags = region_job(NF_LEN), np.zeros(get_threads(), np.bool_)
    job[NF_X], job[NF_N], job[NF_FLAGS], job[NF_PARTS] = x.ctypes.data, x.shape[0], flags.ctypes.data, flags.size
    if not run_native(not_finite_team().address, job):
        return bool(not_finite(x))  # no native regions here (or the team is busy): one thread
    return bool(flags.any())


def _check_records(x: np.ndarray) -> tuple[list, np.ndarray, np.ndarray]:
    """has_not_finite(x) as native_program records writing its answers into flags (one per share): (records, flags,
    job). A region over the team where has_not_finite would split, else the region function on this thread."""
    parts = get_threads()
    job, flags = region_job(NF_LEN), np.zeros(parts, np.bool_)
    job[NF_X], job[NF_N], job[NF_FLAGS], job[NF_PARTS] = x.ctypes.data, x.shape[0], flags.ctypes.data, parts
    fn = not_finite_team().address
    split = native_regions() and threads_for(work_of(0, x.nbytes)) > 1
    record = region_record(fn, job.ctypes.data) if split else None
    return [record if record is not None else (N.OP_CALL, fn, job.ctypes.data)], flags, job


class _ViaBlocked:
    """A plain NCHW pooling on the blocked primitive: the input reordered into nChw{B}c in the workspace, pooled
    into a blocked output there, reordered back into the plain output."""

    def __init__(self, node: Node, geo, block: int):
        self.pool = _Plan(node, geo, block)
        self.impl = self.pool.impl
        x_shape, y_shape = (geo.n, geo.c, geo.h, geo.w), (geo.n, geo.c, geo.oh, geo.ow)
        x_md, y_md = blocked_md(x_shape, block), blocked_md(y_shape, block)
        self.to_blocked = D.reorder_step(D.MemoryDesc.plain(x_shape), x_md)
        self.to_plain = D.reorder_step(y_md, D.MemoryDesc.plain(y_shape))
        self.x_bytes, self.bytes = D.aligned(x_md.nbytes), D.aligned(x_md.nbytes) + D.aligned(y_md.nbytes)
        self.private: np.ndarray | None = None  # when called without the planned workspace

    def run(self, x: np.ndarray, out: np.ndarray, workspace: np.ndarray | None) -> None:
        base, size = D.workspace_base(workspace)
        if size < self.bytes:
            if self.private is None:
                self.private = D.aligned_buffer(self.bytes)
            base = D.address(self.private)
        xb, yb = base, base + self.x_bytes
        self.to_blocked.run({L.ARG_SRC: D.address(x), L.ARG_DST: xb})
        ptrs = {L.ARG_SRC: xb, L.ARG_DST: yb}
        if self.pool.scratch is not None:
            ptrs[L.ARG_SCRATCHPAD] = D.address(self.pool.scratch)
        self.pool.step.run(ptrs)
        self.to_plain.run({L.ARG_SRC: yb, L.ARG_DST: D.address(out)})
        D.wait()
