"""Gemm and MatMul on oneDNN's matmul primitive.

Gemm (y = act(x @ W^T + bias + z) over the last axis): W is reordered once, at build, into the layout the
primitive picks (`format_tag_any`: the packed panels its brgemm kernels stream), bias is the primitive's, the
residual z a binary-add post-op and the activation an eltwise post-op when oneDNN has the same function (else
our apply_activation afterwards). MatMul of two activations: batched, broadcast and strided operands described as
they lie (a transposed operand is a stride pattern, not a copy); a constant operand is packed like a weight.

A plan holds the primitive for one input shape (the max shape's is built with the kernel, smaller ones on first
use and cached); its scratchpad sits in the instance workspace.
"""

from __future__ import annotations

import ctypes
import logging
import math
from collections.abc import Sequence

import numpy as np

from engine.devices.cpu.fused_calls import Native
from engine.devices.cpu.kernel import ShapeCache, remember
from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.threads import get_threads, threads_for, work_of

log = logging.getLogger("engine.onednn")


# Floats added to the row of a constant (K, N) operand that a matmul reads row-major (see unaliased_weights_md).
LD_PAD = 16


def unaliased_weights_md(k: int, n: int) -> D.MemoryDesc:
    """(K, N) row-major with rows LD_PAD floats longer than N.

    Where oneDNN has no packed weight layout (its gemm:jit on hosts without AVX-512) it asks for plain (K, N) and
    reads each column block down K rows N floats apart; when that row is a multiple of 4 KB (N = 1024, 2048,
    3072, ...) the rows fall on the same L1 sets and evict each other. BERT-base's fc1 (128x768x3072) took
    14.3 ms on one thread of an AVX2 EPYC with the plain layout, 6.8 ms with 16 floats more a row, the same
    as OpenBLAS; no shape measured was slower padded (128x768x768 0.87x, 128x3072x768 0.80x, 197x192x768 0.87x,
    Whisper's 1500x384x1536 1.04x, within the noise)."""
    return D.MemoryDesc.strided((k, n), (n + LD_PAD, 1))


class PackedWeights:
    """A constant right-hand operand (K, N) as a strided view of its source array, reordered into each layout a
    primitive asks for (normally one), once. `dims` is (K, N) for a 2-D operand (a plain layout asked for is then
    given padded rows, unaliased_weights_md), else None."""

    def __init__(self, source: np.ndarray, md: D.MemoryDesc, dims: tuple[int, int] | None = None):
        self.source, self.md, self.dims = source, md, dims
        self._packed: list[tuple[D.MemoryDesc, np.ndarray]] = []

    def into(self, md: D.MemoryDesc) -> np.ndarray:
        for have, buf in self._packed:
            if have == md:
                return buf
        out = D.aligned_buffer(md.nbytes)
        D.sync_threads()
        D.reorder_step(self.md, md).run({L.ARG_SRC: self.source.ctypes.data, L.ARG_DST: out.ctypes.data})
        D.wait()
        self._packed.append((md, out))
        return out


def weight_md(w: np.ndarray) -> D.MemoryDesc:
    """The descriptor of a float32 array as it lies in memory (any strides, in elements)."""
    return D.MemoryDesc.strided(w.shape, [s // 4 for s in w.strides])


class Plan:
    """One matmul primitive: src (…, M, K) and dst (…, M, N) described by their strides, weights either packed
    (`packed`) or strided like src, optional bias (…, 1, N) and residual (dst's shape) post-op."""

    def __init__(self, src: D.MemoryDesc, wts: D.MemoryDesc, dst: D.MemoryDesc, bias: D.MemoryDesc | None,
                 residual: D.MemoryDesc | None, eltwise: tuple | None, packed: PackedWeights | None, work: int):
        post_ops: list[tuple] = []
        if residual is not None:
            post_ops.append(("binary_add", residual))
        post_ops.extend(eltwise or ())  # a chain of eltwise post-ops (onednn/eltwise.py)
        attr = D.Attr(post_ops)
        # threads.work_of (multiply-adds, or the weights it streams): a small matmul is created, and runs, on one thread
        self.work = work
        self.created = threads_for(work)  # never run on more (another instance may raise the count later)

        def create(weights: D.MemoryDesc) -> D.PrimitiveDesc:
            return D.PrimitiveDesc.create("dnnl_matmul_primitive_desc_create", D.engine(), src.h, weights.h,
                                          None if bias is None else bias.h, dst.h, attr.h)

        with D.creating(work):
            self.pd = create(wts)
            chosen = self.pd.md(L.QUERY_WEIGHTS_MD)
            if packed is not None and packed.dims is not None and chosen == D.MemoryDesc.plain(packed.dims):
                self.pd = create(unaliased_weights_md(*packed.dims))
                chosen = self.pd.md(L.QUERY_WEIGHTS_MD)
            self._chosen, self._packed = chosen, packed  # packed on the first run (sizing a workspace packs none)
            self.weights: np.ndarray | None = None
            self.weights_ptr = 0  # its address (ndarray.ctypes.data costs ~2 us a call)
            pad = self.pd.md(L.QUERY_SCRATCHPAD_MD)
            self.pad_bytes = D.aligned(pad.nbytes)
            args = {L.ARG_SRC: src, L.ARG_WEIGHTS: chosen, L.ARG_DST: dst, L.ARG_SCRATCHPAD: pad}
            if bias is not None:
                args[L.ARG_BIAS] = bias
            if residual is not None:
                args[L.ARG_POST_OP_SRC1(0)] = residual
            self.step = D.Step(D.Primitive(self.pd), args)
        self.private: np.ndarray | None = None
        self._bound: tuple | None = None

    @property
    def impl(self) -> str:
        return self.pd.impl

    def threads(self) -> int:
        """The OpenMP count it runs with: its work's, never more than it was created for."""
        return min(self.created, threads_for(self.work))

    def scratch(self, workspace: np.ndarray | None) -> int:
        return D.scratch_address(self, workspace)

    def run(self, src: int, wts: int | None, dst: int, bias: int | None, residual: int | None,
            workspace: np.ndarray | None) -> None:
        if self._packed is not None and self.weights is None:
            self.weights = self._packed.into(self._chosen)
            self.weights_ptr = self.weights.ctypes.data
        D.use_threads(self.threads())
        w = self.weights_ptr if self.weights is not None else wts
        key = (src, w, dst, bias, residual, self.scratch(workspace))
        if key != self._bound:
            ptrs = {L.ARG_SRC: src, L.ARG_WEIGHTS: w, L.ARG_DST: dst, L.ARG_SCRATCHPAD: key[5]}
            if bias is not None:
                ptrs[L.ARG_BIAS] = bias
            if residual is not None:
                ptrs[L.ARG_POST_OP_SRC1(0)] = residual
            self._bound = None  # until every memory points where the key says (a failure part-way leaves none)
            for a, p in ptrs.items():
                self.step.mems[a].set(p)
            self._bound = key
        try:
            L.check(L.LIB.dnnl_primitive_execute(self.step.prim.h, D.stream(), len(self.step.args),
                                                 self.step.args), "dnnl_primitive_execute")
            D.wait()
        finally:
            D.restore_threads()


def plan_records(plan: Plan, src: int, wts: int | None, dst: int, bias: int | None, residual: int | None,
                 workspace: np.ndarray | None) -> Native | None:
    """What plan.run with these pointers calls, as native_program records (fused_calls.py), where its memories
    already hold them (its last run's: run does not re-point them then); None otherwise."""
    if plan._packed is not None and plan.weights is None:
        return None
    w = plan.weights_ptr if plan.weights is not None else wts
    if (src, w, dst, bias, residual, plan.scratch(workspace)) != plan._bound:
        return None
    records = [D.threads_record(plan.threads()), D.execute_record(plan.step.prim, plan.step.args),
               D.wait_record(), D.threads_record(get_threads())]
    return Native(records, [(plan, plan._bound)], [plan])


class ThreadPlan:
    """A matmul primitive created for one thread, run from any number of threads at once (a kernel's own pool
    workers): each thread runs it through its own `Runner` (argument memories, scratchpad, this thread's stream),
    so nothing mutable is shared, and a one-thread primitive runs inline (oneDNN forks no OpenMP team for it: the
    runner asks OpenMP for one thread on its thread, see Runner.run), so a worker never parks the pool. Operands
    are described by their strides."""

    def __init__(self, src: D.MemoryDesc, wts: D.MemoryDesc, dst: D.MemoryDesc):
        attr = D.Attr()  # a user scratchpad: each Runner holds its own
        with D.creating(0):  # threads_for(0) is one thread
            self.pd = D.PrimitiveDesc.create("dnnl_matmul_primitive_desc_create", D.engine(), src.h, wts.h, None,
                                             dst.h, attr.h)
            self.prim = D.Primitive(self.pd)
        self.mds = {L.ARG_SRC: src, L.ARG_WEIGHTS: wts, L.ARG_DST: dst,
                    L.ARG_SCRATCHPAD: self.pd.md(L.QUERY_SCRATCHPAD_MD)}

    @classmethod
    def strided(cls, m: int, k: int, n: int, a: tuple[int, int], b: tuple[int, int], c: tuple[int, int]
                ) -> ThreadPlan:
        """(m, k) @ (k, n) -> (m, n), each operand's (row, column) strides in elements."""
        return cls(D.MemoryDesc.strided((m, k), a), D.MemoryDesc.strided((k, n), b), D.MemoryDesc.strided((m, n), c))

    @property
    def impl(self) -> str:
        return self.pd.impl

    def runner(self) -> Runner:
        return Runner(self)


class Runner:
    """One thread's handle on a ThreadPlan: `run(src, wts, dst)` by address, on the calling thread only."""

    def __init__(self, plan: ThreadPlan):
        self.plan = plan
        self.mems = {a: D.Memory(md) for a, md in plan.mds.items()}
        pad = plan.mds[L.ARG_SCRATCHPAD].nbytes
        self.pad = D.aligned_buffer(max(pad, D.ALIGN))
        self.mems[L.ARG_SCRATCHPAD].set(self.pad.ctypes.data)
        self.args = (L.ExecArg * len(self.mems))(*(L.ExecArg(a, m.h) for a, m in self.mems.items()))
        self.src, self.wts, self.dst = (self.mems[a].h for a in (L.ARG_SRC, L.ARG_WEIGHTS, L.ARG_DST))

    def bind(self, src: int, wts: int, dst: int) -> tuple[int, int, int]:
        """Points the memories at these addresses for good: (the primitive, the argument count, the arguments'
        address), what a native caller passes to dnnl_primitive_execute with a stream of its own."""
        L.check(L.LIB.dnnl_memory_set_data_handle(self.src, src) or L.LIB.dnnl_memory_set_data_handle(self.wts, wts)
                or L.LIB.dnnl_memory_set_data_handle(self.dst, dst), "dnnl_memory_set_data_handle")
        return self.plan.prim.h.value, len(self.args), ctypes.addressof(self.args)

    def run(self, src: int, wts: int, dst: int) -> None:
        set_handle, lib = L.LIB.dnnl_memory_set_data_handle, L.LIB
        if not L.OMP.omp_in_parallel():
            # A one-thread brgemm runs inline, but a gemm:jit impl (hosts without AVX-512) reads the calling
            # thread's OpenMP count at run time: the runtime's default (every CPU) on our pool's workers, which would
            # each fork a team. One thread, cached per thread (D._omp_threads); the next primitive's sync_threads
            # sets its own. Inside a region (openmp_pool.py) a nested one forks nothing, and a count set there
            # would end with the region, behind the cache's back.
            D._omp_threads(1)
        L.check(set_handle(self.src, src) or set_handle(self.wts, wts) or set_handle(self.dst, dst),
                "dnnl_memory_set_data_handle")
        s = D.stream()
        L.check(lib.dnnl_primitive_execute(self.plan.prim.h, s, len(self.args), self.args), "dnnl_primitive_execute")
        L.check(lib.dnnl_stream_wait(s), "dnnl_stream_wait")


class Gemm:
    """y (M, N) = act(x (M, K) @ W^T + bias + z) with W (N, K) packed once; plans per M."""

    def __init__(self, w: np.ndarray, bias: np.ndarray | None, eltwise: tuple | None, residual: bool):
        self.w = np.ascontiguousarray(w, np.float32)
        n, k = self.w.shape
        self.n, self.k = n, k
        # W^T as it lies: (K, N) with strides (1, K); the reorder packs it without a transposed copy first.
        self.packed = PackedWeights(self.w, D.MemoryDesc.strided((k, n), (1, k)), (k, n))
        self.bias = None if bias is None else np.ascontiguousarray(np.ravel(bias), np.float32)
        self.bias_ptr = None if self.bias is None else self.bias.ctypes.data  # once: ctypes.data costs ~2 us
        self.eltwise, self.residual = eltwise, residual
        self.plans: dict[int, Plan] = ShapeCache()

    def plan(self, m: int) -> Plan:
        plan = self.plans.get(m)
        if plan is None:
            D.sync_threads()
            src, dst = D.MemoryDesc.plain((m, self.k)), D.MemoryDesc.plain((m, self.n))
            wts = D.MemoryDesc.any((self.k, self.n))
            bias = D.MemoryDesc.plain((1, self.n)) if self.bias is not None else None
            res = D.MemoryDesc.plain((m, self.n)) if self.residual else None
            # the weights are read once a call: a small M streams more bytes than it multiplies (threads.work_of)
            plan = remember(self.plans, m, Plan(src, wts, dst, bias, res, self.eltwise, self.packed,
                                                  work_of(m * self.k * self.n, 4 * self.k * self.n)))
            log.debug("oneDNN matmul %dx%dx%d: %s", m, self.k, self.n, plan.impl)
        return plan

    def records(self, x: np.ndarray, z: np.ndarray | None, out: np.ndarray,
                workspace: np.ndarray | None) -> Native | None:
        """`run` on these (contiguous) arrays as native_program records, see plan_records."""
        m = x.size // self.k
        if m == 0:
            return Native([])
        plan = self.plans.get(m)
        return None if plan is None else plan_records(plan, D.address(x), None, D.address(out), self.bias_ptr,
                                                      None if z is None else D.address(z), workspace)

    def run(self, x: np.ndarray, z: np.ndarray | None, out: np.ndarray, workspace: np.ndarray | None) -> None:
        m = x.size // self.k
        if m == 0:
            return
        D.sync_threads()
        self.plan(m).run(D.address(x), None, D.address(out), self.bias_ptr, None if z is None else D.address(z),
                         workspace)


def _expand(shape: Sequence[int], strides: Sequence[int], rank: int) -> tuple[list[int], list[int]]:
    """shape/strides (bytes) padded with leading broadcast dims to `rank`, strides in elements."""
    pad = rank - len(shape)
    dims = [1] * pad + [int(d) for d in shape]
    el = [0] * pad + [int(s) // 4 for s in strides]
    # A size-1 dim's stride is irrelevant to the data; give it the next dim's extent so oneDNN sees a dense desc.
    for i in range(rank - 1, -1, -1):
        if dims[i] == 1:
            el[i] = el[i + 1] * dims[i + 1] if i + 1 < rank else 1
    return dims, el


class MatMul:
    """out = a @ b for float32 operands of rank >= 2 with numpy's batch broadcasting; `b_const` packs a constant
    right operand once (a 2-D one turns a contiguous (…, M, K) @ (K, N) into one (…·M, K) GEMM). Plans per operand
    shapes and strides."""

    def __init__(self, b_const: np.ndarray | None):
        self.b_const = None if b_const is None else np.ascontiguousarray(b_const, np.float32)
        self.packed = None if self.b_const is None else PackedWeights(
            self.b_const, weight_md(self.b_const), self.b_const.shape if self.b_const.ndim == 2 else None)
        self.plans: dict[tuple, Plan] = ShapeCache()

    def flat(self, a_shape: tuple, out_shape: tuple) -> bool:
        return self.b_const is not None and self.b_const.ndim == 2 and len(a_shape) >= 2

    def plan(self, a_shape: tuple, a_strides: tuple, b_shape: tuple, b_strides: tuple, out_shape: tuple,
             out_strides: tuple) -> Plan:
        key = (a_shape, a_strides, b_shape, b_strides, out_shape, out_strides)
        plan = self.plans.get(key)
        if plan is None:
            D.sync_threads()
            rank = len(out_shape)
            sa, sb = _expand(a_shape, a_strides, rank), _expand(b_shape, b_strides, rank)
            so = _expand(out_shape, out_strides, rank)
            src, dst = D.MemoryDesc.strided(*sa), D.MemoryDesc.strided(*so)
            if self.packed is not None and rank == 2:
                wts, packed = D.MemoryDesc.any(sb[0]), self.packed
            else:
                wts, packed = D.MemoryDesc.strided(*sb), None
            work = work_of(math.prod(out_shape) * int(a_shape[-1]), 4 * math.prod(b_shape))  # B read once a call
            plan = remember(self.plans, key, Plan(src, wts, dst, None, None, None, packed, work))
            log.debug("oneDNN matmul %s @ %s: %s", a_shape, b_shape, plan.impl)
        return plan

    def plan_for(self, a_shape: tuple, b_shape: tuple, out_shape: tuple) -> Plan:
        """The plan for C-contiguous operands of these shapes (what the arena holds)."""
        if self.flat(a_shape, out_shape):
            m, k, n = math.prod(a_shape[:-1]), a_shape[-1], b_shape[-1]
            return self.plan((m, k), (4 * k, 4), (k, n), (4 * n, 4), (m, n), (4 * n, 4))
        return self.plan(a_shape, _dense(a_shape), b_shape, _dense(b_shape), out_shape, _dense(out_shape))

    def records(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, workspace: np.ndarray | None) -> Native | None:
        """`run` on these arrays as native_program records, see plan_records; None for an empty operand."""
        if out.size == 0:
            return Native([])
        if a.size == 0 or b.size == 0:
            return None
        if self.flat(a.shape, out.shape) and a.flags.c_contiguous:
            m, k, n = math.prod(a.shape[:-1]), a.shape[-1], b.shape[-1]
            key = ((m, k), (4 * k, 4), (k, n), (4 * n, 4), (m, n), (4 * n, 4))
        else:
            key = (a.shape, a.strides, b.shape, b.strides, out.shape, out.strides)
        plan = self.plans.get(key)
        return None if plan is None else plan_records(plan, D.address(a), D.address(b), D.address(out), None, None,
                                                      workspace)

    def run(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, workspace: np.ndarray | None) -> None:
        if out.size == 0:
            return
        if a.size == 0 or b.size == 0:
            out[...] = 0
            return
        D.sync_threads()
        if self.flat(a.shape, out.shape) and a.flags.c_contiguous:
            plan = self.plan_for(a.shape, b.shape, out.shape)
        else:
            plan = self.plan(a.shape, a.strides, b.shape, b.strides, out.shape, out.strides)
        plan.run(D.address(a), D.address(b), D.address(out), None, None, workspace)


def _dense(shape: tuple) -> tuple:
    """C-contiguous float32 strides in bytes."""
    strides, step = [], 4
    for d in reversed(shape):
        strides.append(step)
        step *= max(int(d), 1)
    return tuple(reversed(strides))


def scratchpad_bytes(plan: Plan) -> int:
    return plan.pad_bytes + D.ALIGN


def packed_thread_plan(src: D.MemoryDesc, wts_any: D.MemoryDesc, dst: D.MemoryDesc) -> ThreadPlan:
    """A ThreadPlan whose constant weights (`wts_any`: format_tag_any) take the layout its primitive picks; the
    caller reorders them into plan.mds[ARG_WEIGHTS] once and passes their address to every Runner."""
    plan = ThreadPlan(src, wts_any, dst)
    plan.mds[L.ARG_WEIGHTS] = plan.pd.md(L.QUERY_WEIGHTS_MD)
    return plan
