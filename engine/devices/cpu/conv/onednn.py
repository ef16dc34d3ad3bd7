"""Convolutions on oneDNN: the one plan every float32 zero-padded 2-D convolution runs through, whether its sides
are NCHW (Conv, ConvTranspose: deconvolution, see transposed.py) or blocked nChw{B}c (ConvBlocked, see blocked.py).

A `ConvSpec` holds what does not depend on the input shape: the geometry, which sides are blocked, the weights
(reordered once into each layout a primitive asks for), bias and post-ops. A `Plan` holds the primitives for one
input shape. A blocked side uses the nChw{B}c descriptor itself (unless oneDNN has only its reference kernel
for it, see Plan); a plain side is left to the primitive (`format_tag_any`: an order of magnitude faster than
forcing NCHW) and reordered through the instance workspace when the primitive picks another layout. Bias is the
primitive's; SPEC.md's epilogue `y = act(conv + bias + z)` is a `sum` post-op (z copied or reordered into dst
first) then an eltwise post-op when oneDNN has the same function and our own pass is not faster (sigmoid, SiLU, and
erf GELU on AVX2, are: onednn/eltwise.py), else our apply_activation on the output
(elementwise, so layout-agnostic). Workspace layout (each part
64-byte aligned): reordered src | reordered dst | scratchpad. Primitives depend on the shape: the max-shape one is
built with the kernel, smaller shapes get theirs on first use (cached).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu import native_program as N
from engine.devices.cpu.epilogue import activation_records, apply_activation
from engine.devices.cpu.fused_calls import Native, set_records
from engine.devices.cpu.kernel import ShapeCache, remember
from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.onednn.blocked import blocked_md, native_block
from engine.devices.cpu.onednn.eltwise import conv_post_op
from engine.devices.cpu.threads import get_threads, threads_for, work_of
from engine.errors import KernelError
from engine.ir import Node
from engine.ops.conv_geometry import ConvGeom, conv_geom, weight_of
from engine.ops.registry import TensorInfo

log = logging.getLogger("engine.onednn")
Geometry = Callable[[Node, tuple], ConvGeom]


def supported(node: Node, ins: list[TensorInfo]) -> bool:
    """Whether oneDNN computes this conv (float32, 2-D, zero padding); the caller checks oneDNN is on."""
    if np.dtype(ins[0].dtype) != np.float32 or len(ins[0].shape) != 4:
        return False
    return (node.params.get("pad_mode") or "zeros") == "zeros"


class ConvSpec:
    """What does not depend on the input shape: geometry, blocked sides, weights (in every layout asked for), bias,
    post-ops. `geometry(node, shape)` maps the physical input shape to the conv's geometry; `block` > 0 with
    `src_blocked` / `dst_blocked` puts that side in nChw{block}c."""

    def __init__(self, node: Node, residual: bool, geometry: Geometry = conv_geom, block: int = 0,
                 src_blocked: bool = False, dst_blocked: bool = False, own_layouts: bool = False):
        self.node, self.residual, self.geometry = node, residual, geometry
        self.block, self.src_blocked, self.dst_blocked = block, src_blocked, dst_blocked
        # blocked sides: ask for `brgconv` on oneDNN's own layouts first (prefers_own_layouts, decided once at the
        # max shape so that smaller shapes take the same kind of kernel and fit its workspace)
        self.own_layouts = own_layouts
        self.w = np.ascontiguousarray(weight_of(node), np.float32)
        bias = node.attrs.get("bias")
        self.bias = None if bias is None else np.ascontiguousarray(np.ravel(bias), np.float32)
        self.act = node.params.get("activation"), node.params.get("activation_params")
        self.elt = conv_post_op(*self.act)
        self.late = self.elt is None and self.act[0] is not None  # applied after the primitive
        self.post_ops = ([("sum",)] if residual else []) + list(self.elt or ())
        self._weights: list[tuple[D.MemoryDesc, np.ndarray]] = []

    def wshape(self, geo: ConvGeom) -> tuple[int, ...]:
        g = geo.groups
        return (geo.o, geo.c, geo.kh, geo.kw) if g == 1 else (g, geo.o // g, geo.c // g, geo.kh, geo.kw)

    def w_plain(self, geo: ConvGeom) -> D.MemoryDesc:
        """How self.w is laid out, in oneDNN's weight dims."""
        return D.MemoryDesc.plain(self.wshape(geo))

    def side(self, shape: tuple[int, ...], blocked: bool) -> D.MemoryDesc:
        """What the primitive is asked to take on one side: the blocked layout itself, else its own choice."""
        return blocked_md(shape, self.block) if blocked else D.MemoryDesc.any(shape)

    def given(self, shape: tuple[int, ...], blocked: bool) -> D.MemoryDesc:
        """How the kernel's array on one side is laid out: nChw{B}c or NCHW."""
        return blocked_md(shape, self.block) if blocked else D.MemoryDesc.plain(shape)

    def primitive_desc(self, geo: ConvGeom, x_md: D.MemoryDesc, w_md: D.MemoryDesc, b_md: D.MemoryDesc | None,
                       y_md: D.MemoryDesc, attr: D.Attr) -> D.PrimitiveDesc:
        return D.PrimitiveDesc.create(
            "dnnl_convolution_forward_primitive_desc_create", D.engine(), L.FORWARD_INFERENCE,
            L.CONVOLUTION_DIRECT, x_md.h, w_md.h, None if b_md is None else b_md.h, y_md.h, L.dims(geo.stride),
            L.dims(d - 1 for d in geo.dilation), L.dims(geo.pads[:2]), L.dims(geo.pads[2:]), attr.h)

    def weights_in(self, md: D.MemoryDesc, geo: ConvGeom) -> np.ndarray:
        for have, buf in self._weights:
            if have == md:
                return buf
        buf = D.reorder_into(self.w, self.w_plain(geo), md)
        self._weights.append((md, buf))
        return buf


def is_reference(impl: str) -> bool:
    """Whether oneDNN fell back on its reference implementation (scalar loops, 100-1000x slower than its jit
    kernels: a dilated 3x3 conv on nChw16c sides took 180 s instead of 30 ms)."""
    return impl.startswith("ref")


class Plan:
    """The primitives for one physical input shape, and where their buffers sit in the workspace.

    A blocked side is asked of the primitive first; oneDNN has no optimized kernel for some convs on
    nChw{B}c (dilated ones, inputs of fewer channels than a block, depthwise ones with one side plain: those
    are asked on both sides blocked first, see DEPTHWISE_BLOCKED), and
    gives those its reference implementation, so such a plan asks again with every side left to the primitive
    and reorders the blocked sides into and out of its choice (the reorders cost a fraction of a conv).
    """

    def __init__(self, spec: ConvSpec, shape: tuple[int, ...]):
        geo = spec.geometry(spec.node, shape)
        self.geo = geo
        # multiply-adds, or the float32 weights it streams where they weigh more (a 1x1 map: threads.work_of): a
        # small conv is created for, and runs on, one thread (D.creating), so it never forks
        taps = geo.o * (geo.c // geo.groups) * geo.kh * geo.kw
        self.work = work_of(geo.n * geo.oh * geo.ow * taps, 4 * taps)
        with D.creating(self.work):
            self._create(spec, geo)

    def _create(self, spec: ConvSpec, geo) -> None:
        x_log, y_log = (geo.n, geo.c, geo.h, geo.w), geo.out_shape
        b_md = D.MemoryDesc.plain((geo.o,)) if spec.bias is not None else None
        attr = D.Attr(spec.post_ops)
        self.pd = _primitive_desc(spec, geo, b_md, attr)
        src, wts, dst, pad = (self.pd.md(q) for q in (L.QUERY_SRC_MD, L.QUERY_WEIGHTS_MD, L.QUERY_DST_MD,
                                                       L.QUERY_SCRATCHPAD_MD))
        self.weights, self.bias = spec.weights_in(wts, geo), spec.bias
        args = {L.ARG_SRC: src, L.ARG_WEIGHTS: wts, L.ARG_DST: dst, L.ARG_SCRATCHPAD: pad}
        if b_md is not None:
            args[L.ARG_BIAS] = b_md
        self.conv = D.Step(D.Primitive(self.pd), args)
        x_given, y_given = spec.given(x_log, spec.src_blocked), spec.given(y_log, spec.dst_blocked)
        self.src_in = None if src == x_given else D.reorder_step(x_given, src)
        self.dst_out = None if dst == y_given else D.reorder_step(dst, y_given)
        self.z_in = D.reorder_step(y_given, dst) if self.dst_out is not None and spec.residual else None
        self.src_bytes = D.aligned(src.nbytes) if self.src_in is not None else 0
        self.dst_bytes = D.aligned(dst.nbytes) if self.dst_out is not None else 0
        self.pad_bytes = D.aligned(pad.nbytes)
        self.private: np.ndarray | None = None  # only when the instance workspace is too small for this shape
        self._bound: tuple[int, int, int] | None = None  # (src, dst, scratchpad) pointers the memories hold
        # (dst, scratchpad) of `_bound`, replaced only when those change: what a program reading the caller's
        # input relies on (its source memory is its own: `records`), so a Python run on another array keeps it
        self._targets: tuple[int, int] | None = None
        self._own_src: tuple | None = None  # (memory, arguments) of programs reading the caller's input (`records`)

    @property
    def nbytes(self) -> int:
        return self.src_bytes + self.dst_bytes + self.pad_bytes

    @property
    def impl(self) -> str:
        return self.pd.impl

    def base(self, workspace: np.ndarray | None) -> int:
        ptr, size = D.workspace_base(workspace)
        if size >= self.nbytes:
            return ptr
        if self.private is None:  # a layout for a smaller shape that needs more room than the max shape's
            log.debug("oneDNN conv %s at %s: %d bytes beyond the workspace, own buffer", self.geo, self.impl,
                      self.nbytes)
            self.private = D.aligned_buffer(self.nbytes)
        return self.private.ctypes.data

    def run(self, x: np.ndarray, z: np.ndarray | None, out: np.ndarray, workspace: np.ndarray | None) -> None:
        base = self.base(workspace)
        src = D.address(x)
        if self.src_in is not None:
            self.src_in.run({L.ARG_SRC: src, L.ARG_DST: base})
            src = base
        dst = base + self.src_bytes if self.dst_out is not None else D.address(out)
        if z is not None:
            if self.z_in is not None:
                self.z_in.run({L.ARG_SRC: D.address(z), L.ARG_DST: dst})
            else:
                np.copyto(out, z)
        scratch = base + self.src_bytes + self.dst_bytes
        if (src, dst, scratch) == self._bound:
            # the same arena views as last time (the usual case: bound once per input shape): only execute
            self._execute()
        else:
            ptrs = {L.ARG_SRC: src, L.ARG_WEIGHTS: self.weights.ctypes.data, L.ARG_DST: dst,
                    L.ARG_SCRATCHPAD: scratch}
            if self.bias is not None:
                ptrs[L.ARG_BIAS] = self.bias.ctypes.data
            D.sync_threads(self.work)  # never more threads than it was created for
            self._bound = None  # until every memory points where the tuple says (a failure part-way leaves none)
            if self._targets != (dst, scratch):
                self._targets = None
            try:
                self.conv.run(ptrs)
            finally:
                D.restore_threads()
            self._bound = (src, dst, scratch)
            if self._targets is None:
                self._targets = (dst, scratch)
        if self.dst_out is not None:
            self.dst_out.run({L.ARG_SRC: dst, L.ARG_DST: D.address(out)})
        D.wait()

    def records(self, x: np.ndarray, z: np.ndarray | None, out: np.ndarray, workspace: np.ndarray | None,
                caller: bool = False, fresh: bool = False) -> tuple[list, tuple, list, list] | None:
        """What `run` on these arrays calls, as native_program records, the pointers the conv's memories must
        hold for them (its last run's: the records do not re-point them, as `run` does not when they are
        unchanged), with `caller` (x is the caller's input, another array each run) the rebinds of x's address
        and with `fresh` (out is a fresh array each run) those of out's (fused_calls.Native); None when its last
        run was not on these arrays, a residual copy is not a plain one, or out is fresh where no reorder writes
        it (the primitive's own destination memory, which `run` trusts while `_bound` says so)."""
        if fresh and (self.dst_out is None or z is not None):
            return None
        base = self.base(workspace)
        src = D.address(x)
        recs: list = []
        count = threads_for(None)  # sync_threads() before the plan runs
        if self.src_in is not None:
            recs += self.src_in.records({L.ARG_SRC: src, L.ARG_DST: base}, count)
            src = base
        dst = base + self.src_bytes if self.dst_out is not None else D.address(out)
        if z is not None:
            if self.z_in is not None:
                recs += self.z_in.records({L.ARG_SRC: D.address(z), L.ARG_DST: dst}, count)
            elif not (z.dtype == out.dtype and z.shape == out.shape and z.flags.c_contiguous
                      and out.flags.c_contiguous):
                return None
            elif D.address(z) != D.address(out):
                recs.append(N.copy_record(D.address(out), D.address(z), out.nbytes))
        scratch = base + self.src_bytes + self.dst_bytes
        own = caller and self.src_in is None  # the conv reads the caller's x itself: a source memory of its own
        if (dst, scratch) != self._targets if own else (src, dst, scratch) != self._bound:
            return None
        args, source = self.conv.args, self.src_in.mems[L.ARG_SRC] if self.src_in is not None else None
        if own:
            source, args = self._caller_source()
            recs.append((N.OP_SET, D.fn_address("dnnl_memory_set_data_handle"), source.h.value, src))
        recs.append(D.threads_record(threads_for(self.work)))
        recs.append(D.execute_record(self.conv.prim, args))
        recs.append(D.threads_record(get_threads()))
        if self.dst_out is not None:
            recs += self.dst_out.records({L.ARG_SRC: dst, L.ARG_DST: D.address(out)}, get_threads())
        recs.append(D.wait_record())
        rebinds = [(0, None, at) for at in set_records(recs, source)] if caller else []
        out_rebinds = [(0, None, at) for at in set_records(recs, self.dst_out.mems[L.ARG_DST])] if fresh else []
        return recs, (_Targets(self), self._targets) if own else (self, self._bound), rebinds, out_rebinds

    def _caller_source(self) -> tuple[D.Memory, ctypes.Array]:
        """A source memory and argument list of the programs whose input is the caller's array (pointed at each
        run's array before the replay): the plan's own source memory keeps the pointer its Python run set, which
        `run` trusts while `_bound` says so (it only executes then), so no program may re-point it."""
        if self._own_src is None:
            memory = D.Memory(self.conv.mems[L.ARG_SRC].md)
            args = (L.ExecArg * len(self.conv.args))(*(L.ExecArg(a.arg, memory.h if a.arg == L.ARG_SRC else a.memory)
                                                      for a in self.conv.args))
            self._own_src = (memory, args)
        return self._own_src

    @property
    def direct(self) -> bool:
        """Whether a run is the primitive alone: no reorder in or out and no residual to place first (so a run on
        the arrays it last ran on may be `execute_bound` alone, see BoundRuns)."""
        return self.src_in is None and self.dst_out is None and self.z_in is None

    def _execute(self) -> None:
        """The primitive on the pointers its memories already hold (those of the last run)."""
        D.sync_threads(self.work)  # never more threads than it was created for
        try:
            L.check(L.LIB.dnnl_primitive_execute(self.conv.prim.h, D.stream(), len(self.conv.args), self.conv.args),
                    "dnnl_primitive_execute")
        finally:
            D.restore_threads()

    def execute_bound(self) -> None:
        """A direct plan's run on the arrays of its last run: the primitive alone, and the wait."""
        self._execute()
        D.wait()


class _Targets:
    """A plan's `_targets` seen as the `_bound` that fused_calls checks (`obj._bound is pointers`): a program whose
    conv reads the caller's input through a source memory of its own holds while the plan's destination and
    scratchpad stay where it recorded them, whichever array a Python run of the plan read meanwhile."""

    __slots__ = ("plan",)

    def __init__(self, plan: Plan):
        self.plan = plan

    @property
    def _bound(self) -> tuple[int, int] | None:
        return self.plan._targets


def plan_native(spec: ConvSpec, plan: Plan | None, inputs: list, outputs: list, workspace,
                reads: tuple[int, ...] = (), writes: tuple[int, ...] = ()) -> Native | None:
    """A conv kernel's run on these arrays as native_program records (fused_calls.py): the plan's, then the late
    activation's; None where the run would do anything else (no plan yet, a copy of a non-contiguous input).
    `reads`, `writes`: the inputs and outputs that are arrays new each run (Bound.varying): the source (0,) (the
    caller's), rebound before each replay, and the output (0,) (a fresh one) where a reorder writes it and no
    activation pass follows (native_rebound); a residual from the caller gets no records."""
    x, out = inputs[0], outputs[0]
    z = inputs[1] if spec.residual else None
    if plan is None or not x.flags.c_contiguous or (z is not None and not z.flags.c_contiguous):
        return None
    if reads not in ((), (0,)) or writes not in ((), (0,)) or (writes and spec.late):
        return None
    got = plan.records(x, z, out, workspace, reads == (0,), writes == (0,))
    act = activation_records(*spec.act, out) if spec.late else ([], [])
    if got is None or act is None:
        return None
    records, check, rebinds, out_rebinds = got
    return Native(records + act[0], [check], [plan, *act[1]], rebinds, out_rebinds=out_rebinds)


class BoundRuns:
    """A kernel's shortcut for the usual run: the same arena arrays as the last run (a binding's views are the same
    objects run after run), on a plan that is the primitive alone (Plan.direct), with nothing after it. Then the run
    is Plan.execute_bound, skipping the contiguity checks, the plan lookups and the pointer arithmetic (~1.5-2 us
    of a small conv's ~4 us of Python; GhostNet runs 95 convs a call). The arrays are compared by identity, which
    is safe: an array's data never moves, and the shortcut holds them, so no other array can take their id. Holding
    them keeps one set alive until the kernel's next run: arena views, or for a conv on a graph input the caller's
    last input array (and its output, where that is handed out), a request's worth at most."""

    def __init__(self):
        self.last: tuple | None = None

    def hit(self, inputs: list, out: np.ndarray, workspace: np.ndarray | None) -> bool:
        """Runs the shortcut and returns True when it applies to these arrays."""
        last = self.last
        if last is None or last[0] is not out or last[1] is not workspace or len(inputs) != len(last[2]):
            return False
        for a, b in zip(inputs, last[2], strict=True):
            if a is not b:
                return False
        last[3].execute_bound()
        return True

    def remember(self, plan: Plan, inputs: list, out: np.ndarray, workspace: np.ndarray | None) -> None:
        """After a full run of `plan` on these very arrays (not copies), with nothing after it: the next run on the
        same ones may take the shortcut (only a direct plan, with no residual: its copy into the output must be made
        every run). A kernel clears `last` before every full run, whose plan may point its memories elsewhere."""
        self.last = (out, workspace, tuple(inputs), plan) if plan.direct and len(inputs) == 1 else None


# A plain src of at most this many channels is read as it lies when oneDNN has a jit kernel for that (its
# first-layer kernels): left to the primitive it picks NHWC for brgconv and pays a reorder of the whole input
# (8->16 @160: 1.12 -> 0.97 ms CPU).
PLAIN_SRC_CHANNELS = 8
# A depthwise conv with a plain side runs on nChw{B}c sides (the plain ones reordered in and out): oneDNN's jit_dw
# kernel there beat the brdgmm_dw one it picks on NHWC, reorders included, by 12-29% CPU (3x3-7x7, 32-96
# channels, 56-112 maps, both sides plain). With one side blocked (EfficientFormerV2's 3x3 over 1024 channels at
# 7x7, blocked in, plain out, a residual) NCHW <-> NHWC reorders of the plain side and the residual cost twice
# the conv: 90 -> 50 us CPU at one thread.
DEPTHWISE_BLOCKED = True
# A dense square kxk conv (k > 1) of at least SMALL_MAP_CHANNELS input channels and at most SMALL_MAP_PIXELS output
# pixels in all runs on the layouts oneDNN picks (NHWC: `brgconv`), its blocked sides reordered in and out, where the
# blocked sides alone get AVX2's `jit` direct kernel (nChw8c), which splits so few pixels poorly. In-process A/B, AVX2
# EPYC, 2 vCPUs, batch 1, blocked in and out, 1 / 2 threads: 3x3 s2 512 @7 0.73 / 0.75, 512 @14 0.87 / 0.81,
# 256->512 @14 0.75 / 0.75, 256 @14 0.71-0.81 / 0.75-0.82, 176 @14 0.74 / 0.89, 128 @14 0.88 / 0.95, 160->80 @8
# 0.79-0.80 / 0.92-0.99 (ResNet-18 at batch 1 0.96-0.99x); fewer channels lose or tie (64 @8 1.07 / 1.04, 64->128
# s2 @16 1.00 / 0.98), more pixels too (128 s2 @28, 196 pixels, 0.95 / 1.08; 32->64 s2 @56 1.19 / 1.11), so do
# 1x1 convs everywhere (`brgconv_1x1` 1.07-1.51x of `jit_1x1`) and Inception-v3's 1x3 and 3x1 convs over 8x8 maps
# (the model 1.10x at two threads).
SMALL_MAP_PIXELS, SMALL_MAP_CHANNELS = 64, 128


def is_jit(impl: str) -> bool:
    """A jit or brgemm kernel: neither the reference nor the gemm-based one (im2col, 2-10x slower here)."""
    return not is_reference(impl) and "gemm:" not in impl


def prefers_own_layouts(geo: ConvGeom) -> bool:
    """A dense conv that runs `brgconv` on its own layouts rather than `jit` on blocked sides (SMALL_MAP_PIXELS),
    judged at the max shape (ConvSpec.own_layouts)."""
    return (geo.groups == 1 and geo.kh == geo.kw > 1 and geo.n * geo.oh * geo.ow <= SMALL_MAP_PIXELS
            and geo.c >= SMALL_MAP_CHANNELS)


def _primitive_desc(spec: ConvSpec, geo: ConvGeom, b_md: D.MemoryDesc | None, attr: D.Attr) -> D.PrimitiveDesc:
    """The conv's primitive on the blocked sides asked for, or on sides of its own choice where oneDNN has only
    its reference implementation for those (see Plan) or where its kernel there beats the blocked one
    (SMALL_MAP_PIXELS); a dense conv of few channels first on its plain src."""
    x_log, y_log = (geo.n, geo.c, geo.h, geo.w), geo.out_shape
    w_any = D.MemoryDesc.any(spec.wshape(geo))
    if not spec.src_blocked and geo.groups == 1 and geo.c <= PLAIN_SRC_CHANNELS:
        x_plain, y_side = D.MemoryDesc.plain(x_log), spec.side(y_log, spec.dst_blocked)
        direct = spec.primitive_desc(geo, x_plain, w_any, b_md, y_side, attr)
        if is_jit(direct.impl):
            return direct
    block = native_block() if DEPTHWISE_BLOCKED else 0
    if block and not (spec.src_blocked and spec.dst_blocked) and geo.groups == geo.c == geo.o:
        x_blk, y_blk = blocked_md(x_log, block), blocked_md(y_log, block)
        dw = spec.primitive_desc(geo, x_blk, w_any, b_md, y_blk, attr)
        if is_jit(dw.impl):
            return dw
    # Locals keep the descriptors alive through the call (a temporary's handle would be freed first).
    x_req, y_req = spec.side(x_log, spec.src_blocked), spec.side(y_log, spec.dst_blocked)
    pd = spec.primitive_desc(geo, x_req, w_any, b_md, y_req, attr)
    if spec.own_layouts and (spec.src_blocked or spec.dst_blocked) and pd.impl == "jit:avx2":
        x_any, y_any = D.MemoryDesc.any(x_log), D.MemoryDesc.any(y_log)
        free = spec.primitive_desc(geo, x_any, w_any, b_md, y_any, attr)
        if free.impl.startswith("brgconv"):
            return free
    if (spec.src_blocked or spec.dst_blocked) and is_reference(pd.impl):
        x_any, y_any = D.MemoryDesc.any(x_log), D.MemoryDesc.any(y_log)
        free = spec.primitive_desc(geo, x_any, w_any, b_md, y_any, attr)
        log.debug("%s: oneDNN has %s on the blocked sides, %s on its own layouts (reordered)", spec.node.where(),
                  pd.impl, free.impl)
        if not is_reference(free.impl):
            return free
    return pd


def primitive_impl(spec: ConvSpec, shape: tuple[int, ...]) -> str:
    """The implementation oneDNN runs this conv with at this input shape (no weights reordered)."""
    D.sync_threads()
    geo = spec.geometry(spec.node, shape)
    b_md = D.MemoryDesc.plain((geo.o,)) if spec.bias is not None else None
    return _primitive_desc(spec, geo, b_md, D.Attr(spec.post_ops)).impl


def workspace(spec: ConvSpec, ins: list[TensorInfo]) -> int:
    """Bytes for the max shape's reordered src, reordered dst and scratchpad, plus room to align the start."""
    D.sync_threads()
    return Plan(spec, tuple(ins[0].shape)).nbytes + D.ALIGN


def build(spec: ConvSpec, ins: list[TensorInfo]) -> Kernel:
    """The kernel of a plain (NCHW) Conv or ConvTranspose on the plan of each input shape."""
    node = spec.node
    D.sync_threads()
    max_shape = tuple(ins[0].shape)
    first = Plan(spec, max_shape)
    plans = ShapeCache({max_shape: first})
    bound = BoundRuns()

    def run(inputs, outputs, workspace):
        if bound.hit(inputs, outputs[0], workspace):
            return
        bound.last = None  # a full run may point the plan's memories elsewhere
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        z = np.ascontiguousarray(inputs[1]) if spec.residual else None
        D.sync_threads()
        plan = plans.get(x.shape)
        if plan is None:
            if any(a > b for a, b in zip(x.shape, max_shape, strict=True)):
                raise KernelError(f"{node.where()}: {node.op_type} input {x.shape} is beyond the max shape "
                                  f"{max_shape} its workspace was planned for")
            plan = remember(plans, x.shape, Plan(spec, x.shape))
            log.debug("%s: oneDNN %s for input %s: %s", node.where(), node.op_type, x.shape, plan.impl)
        plan.run(x, z, out, workspace)
        if spec.late:
            apply_activation(spec.act[0], spec.act[1], out)
        elif x is inputs[0]:
            bound.remember(plan, inputs, out, workspace)

    def native(inputs, outputs, workspace):
        return plan_native(spec, plans.get(inputs[0].shape), inputs, outputs, workspace)

    def native_rebound(inputs, outputs, workspace, reads, writes):
        nat = plan_native(spec, plans.get(inputs[0].shape), inputs, outputs, workspace, reads, writes)
        if nat is not None:
            bound.last = None  # its programs run instead of its Python: the caller's last array is not kept
        return nat

    log.debug("%s: oneDNN %s for input %s: %s", node.where(), node.op_type, max_shape, first.impl)
    run.native = native  # type: ignore[attr-defined]
    run.native_rebound = native_rebound  # type: ignore[attr-defined]
    # a graph's output (runtime/bind.py) where the max shape's plan reorders into it (the usual depthwise one)
    writes = first.dst_out is not None and not spec.residual and not spec.late
    run.writes_fresh = lambda out: writes  # type: ignore[attr-defined]
    run.impl = f"onednn:{first.impl}"  # type: ignore[attr-defined]
    run.plans = plans  # type: ignore[attr-defined]
    return run
