"""CPU kernels of the blocked layout's ops (blocked_ops.py, regroup.py; ConvBlocked's is conv/blocked.py).

ToBlocked / ToPlain: the numpy kernels copy whole blocks with one strided copy and the last partial block apart;
with oneDNN a reorder primitive does the same (several times faster on big maps, and it writes the padding
lanes' zeros). The pools and BroadcastBlocked run numba loops over the B lanes of a pixel (loops.py), or oneDNN's
pooling / binary primitives on nChw{B}c when oneDNN is on; RegroupBlocked builds each destination block by vector
permutes where the CPU has them for the block (loops/lane_permute.py) and the map takes few of them a block, else
copies runs of lanes.
"""

from __future__ import annotations

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu import native_program as N
from engine.devices.cpu import threads as T
from engine.devices.cpu.fused_calls import Native, set_records, step_native
from engine.devices.cpu.kernel import Backends, CpuKernel, reference_fallback, remember
from engine.devices.cpu.layout import loops as LL
from engine.devices.cpu.layout.blocked_ops import (
    BROADCAST_OPS,
    as_maxpool,
    broadcast_operands,
    broadcast_reference,
    global_reference,
    lanes_as_channels,
    layout_params,
    maxpool_reference_blocked,
)
from engine.devices.cpu.layout.regroup import reference as regroup_reference
from engine.devices.cpu.layout.regroup import regroup_params
from engine.devices.cpu.loops.lane_permute import native_width
from engine.devices.cpu.onednn import binary as onednn_binary
from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.onednn import pool as onednn_pool
from engine.devices.cpu.onednn.blocked import blocked_md
from engine.devices.cpu.threads import get_threads, native_regions, parallel_for, region_job, run_native
from engine.ir import Node
from engine.ops.pool import pool_geom
from engine.ops.registry import TensorInfo


def reorder(onednn: bool, to_blocked: bool, block: int, dtype: np.dtype) -> Kernel:
    """ToBlocked's (`to_blocked`) or ToPlain's kernel: oneDNN's reorder for float32 when it is on, else numpy's
    copy."""
    if dtype == np.float32 and onednn:
        return _onednn_kernel(to_blocked, block)
    return _numpy_kernel(to_blocked, block)


def _numpy_kernel(to_blocked: bool, block: int) -> Kernel:
    def run(inputs, outputs, workspace):
        (blocked_into if to_blocked else plain_into)(inputs[0], outputs[0], block)
    return run


def blocked_into(x: np.ndarray, out: np.ndarray, block: int) -> None:
    n, c, h, w = x.shape
    full, rem = divmod(c, block)
    if full:
        np.copyto(out[:, :full], x[:, :full * block].reshape(n, full, block, h, w).transpose(0, 1, 3, 4, 2))
    if rem:
        np.copyto(out[:, full, :, :, :rem], x[:, full * block:].transpose(0, 2, 3, 1))
        out[:, full, :, :, rem:] = 0


def plain_into(x: np.ndarray, out: np.ndarray, block: int) -> None:
    n, c, h, w = out.shape
    full, rem = divmod(c, block)
    if full:
        np.copyto(out[:, :full * block].reshape(n, full, block, h, w), x[:, :full].transpose(0, 1, 4, 2, 3))
    if rem:
        np.copyto(out[:, full * block:], x[:, full, :, :, :rem].transpose(0, 3, 1, 2))


def _onednn_kernel(to_blocked: bool, block: int) -> Kernel:
    steps: dict[tuple, object] = {}
    # a partial last block's loops (_WholeBlocksToBlocked, _WholeBlocksToPlain), compiled (or loaded) now, not in a
    # request
    if to_blocked:
        LL.last_block_in(np.zeros((1, 2, 1), np.float32), np.zeros((1, 1, 1, 2), np.float32), 1, 0, 1)
        LL.last_block_team()
    else:
        LL.last_block_out(np.zeros((1, 1, 1, 2), np.float32), np.zeros((1, 2, 1), np.float32), 1, 0, 1)
        LL.last_block_out_team()

    def step_for(plain_shape: tuple) -> object:
        step = steps.get(plain_shape)
        if step is None:
            if not to_blocked and _whole_blocks_then_partial(plain_shape[1], block):
                step = remember(steps, plain_shape, _WholeBlocksToPlain(plain_shape, block))
            elif to_blocked and plain_shape[1] % block and (plain_shape[0] == 1 or plain_shape[1] < block):
                step = remember(steps, plain_shape, _WholeBlocksToBlocked(plain_shape, block))
            else:
                plain, blocked = D.MemoryDesc.plain(plain_shape), blocked_md(plain_shape, block)
                step = remember(steps, plain_shape, D.reorder_step(plain, blocked) if to_blocked
                                else D.reorder_step(blocked, plain))
        return step

    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        if not out.flags.c_contiguous:  # oneDNN writes through the raw pointer as dense: numpy's strided copy
            (blocked_into if to_blocked else plain_into)(x, out, block)
            return
        step = step_for(x.shape if to_blocked else out.shape)
        D.sync_threads()
        if isinstance(step, _PartialLastBlock):
            step.run(x, out)
            return
        step.run({L.ARG_SRC: D.address(x), L.ARG_DST: D.address(out)})
        D.wait()

    def native(inputs, outputs, workspace, reads: bool = False, writes: bool = False):
        x, out = inputs[0], outputs[0]
        if not (x.flags.c_contiguous and out.flags.c_contiguous):
            return None
        step = steps.get(x.shape if to_blocked else out.shape)
        if isinstance(step, _PartialLastBlock) and x.dtype == out.dtype == np.float32:
            return step.records(x, out, reads, writes)
        if not isinstance(step, D.Step):
            return None
        ptrs = {L.ARG_SRC: D.address(x), L.ARG_DST: D.address(out)}
        return step_native(step, ptrs, step)

    def native_rebound(inputs, outputs, workspace, reads: tuple[int, ...], writes: tuple[int, ...]) -> Native | None:
        """`native` for a ToBlocked of the caller's input (a graph's first op: `reads` (0,)) or a ToPlain into a
        fresh output (a graph's last: `writes` (0,)): the records' pointer to that array rebound before each replay
        (the reorder's memory, the last block's job word); the kernel's own run points them anew each call, so the
        program's pointers never leak into it."""
        if (reads, writes) != (((0,), ()) if to_blocked else ((), (0,))):
            return None
        nat = native(inputs, outputs, workspace, bool(reads), bool(writes))
        if nat is None:
            return None
        step = steps.get(inputs[0].shape if to_blocked else outputs[0].shape)
        reorder = step.step if isinstance(step, _PartialLastBlock) else step
        sets = [] if reorder is None else set_records(nat.records, reorder.mems[L.ARG_SRC if reads else L.ARG_DST])
        if len(sets) != (reorder is not None):  # one image's reorder at most (several would need offsets)
            return None
        if reads:
            nat.rebinds = [(0, None, at) for at in sets] + nat.rebinds  # the lanes' job word (`records`) after them
        else:
            nat.out_rebinds = [(0, None, at) for at in sets] + nat.out_rebinds
        return nat

    run.native = native  # type: ignore[attr-defined]
    run.native_rebound = native_rebound  # type: ignore[attr-defined]
    if not to_blocked:
        def writes_fresh(out: np.ndarray) -> bool:
            """A graph's output (runtime/bind.py), but where several images' whole blocks take one reorder each
            (`_WholeBlocksToPlain`): their records hold the output's address at offsets, not rebound."""
            return out.shape[0] == 1 or not _whole_blocks_then_partial(out.shape[1], block)

        run.writes_fresh = writes_fresh  # type: ignore[attr-defined]
    return run


def _whole_blocks_then_partial(channels: int, block: int) -> bool:
    """Whether a ToPlain of this many channels is whole blocks and a partial last one (`_WholeBlocksToPlain`)."""
    return channels > block and channels % block != 0


class _PartialLastBlock:
    """A reorder between NCHW and nChw{B}c whose last block is partial, as oneDNN's reorder of the whole blocks (if
    any), one image at a time, and a numba loop over the last block's lanes (layout/loops.py): ToBlocked's
    (`_WholeBlocksToBlocked`) or ToPlain's (`_WholeBlocksToPlain`). oneDNN reorders a partial block with its generic
    kernel (jit:uni), and a sub-memory of more than one image too."""

    to_blocked = True

    def __init__(self, shape: tuple, block: int):
        n, c, h, w = shape
        self.full, self.block = c // block * block, block
        self.step = None
        plain_bytes, blocked_bytes = c * h * w * 4, -(-c // block) * h * w * block * 4  # an image's
        self.strides = (plain_bytes, blocked_bytes) if self.to_blocked else (blocked_bytes, plain_bytes)
        if self.full:
            one = (1, c, h, w)
            plain = D.MemoryDesc.strided((1, self.full, h, w), (c * h * w, h * w, w, 1))
            blocked = D.MemoryDesc.submemory(blocked_md(one, block), (1, self.full, h, w), (0, 0, 0, 0))
            self.step = D.reorder_step(plain, blocked) if self.to_blocked else D.reorder_step(blocked, plain)

    def _images(self, x: np.ndarray, out: np.ndarray) -> list[dict[int, int]]:
        """The whole blocks' reorder's pointers for each image of x and out."""
        src, dst = D.address(x), D.address(out)
        return [{L.ARG_SRC: src + i * self.strides[0], L.ARG_DST: dst + i * self.strides[1]}
                for i in range(x.shape[0])]

    def _sides(self, x: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(plain, blocked) of the two."""
        return (x, out) if self.to_blocked else (out, x)

    def _reorders(self, x: np.ndarray, out: np.ndarray) -> None:
        if self.step is not None:
            for ptrs in self._images(x, out):
                self.step.run(ptrs)
            D.wait()

    def records(self, x: np.ndarray, out: np.ndarray, reads: bool = False, writes: bool = False) -> Native | None:
        """`run` on these (contiguous float32) arrays as native_program records: the whole blocks' reorders and
        the last block's loop, as one region where `run` would split its images, else on this thread; None where
        `run` would split them from Python (the team not running native regions). `reads`: x is the caller's input
        (ToBlocked's), the loop's job word for it among the rebinds; `writes`: out is a fresh output (ToPlain's),
        its job word among the out_rebinds."""
        plain, blocked = self._sides(x, out)
        n, c, h, w = plain.shape
        recs: list = []
        if self.step is not None:
            for ptrs in self._images(x, out):
                recs += self.step.records(ptrs, T.threads_for(None))
            recs.append(D.wait_record())
        job = region_job(LL.LB_LEN)
        job[LL.LB_N:LL.LB_SRC] = n, c, h * w, blocked.shape[1], self.block
        job[LL.LB_SRC], job[LL.LB_DST], job[LL.LB_FIRST] = D.address(x), D.address(out), self.full
        fn = (LL.last_block_team() if self.to_blocked else LL.last_block_out_team()).address
        record = ((N.OP_CALL, fn, job.ctypes.data) if T.chunks_for(n, n * h * w * self.block) <= 1
                  else T.region_record(fn, job.ctypes.data) if T.get_threads() > 1 and native_regions() else None)
        # where x is the caller's input or out a fresh output, its address goes into the job's word too
        # (native_rebound)
        rebinds, out_rebinds = [(0, job, LL.LB_SRC)] if reads else [], [(0, job, LL.LB_DST)] if writes else []
        return None if record is None else Native(recs + [record], [], [self, job], rebinds, out_rebinds=out_rebinds)


class _WholeBlocksToPlain(_PartialLastBlock):
    """ToPlain of a map whose last block is partial (C > B, C % B != 0), the lanes by layout/loops.last_block_out:
    20 channels @56 0.049 -> 0.020 ms, 72 @56 0.167 -> 0.046, batch 8 of 20 @56 0.21 -> 0.15 against oneDNN's
    generic reorder (one thread, AVX-512 EPYC). Recorded into native programs (numpy copied the lanes before, and
    a graph's segment ended there)."""

    to_blocked = False

    def run(self, x: np.ndarray, out: np.ndarray) -> None:
        n, c, h, w = out.shape
        self._reorders(x, out)
        parallel_for(LL.last_block_out, n, n * h * w * self.block, x.reshape(n, x.shape[1], h * w, self.block),
                     out.reshape(n, c, h * w), self.full)


class _WholeBlocksToBlocked(_PartialLastBlock):
    """ToBlocked of one image whose last block is partial (C % B != 0), or of a batch of fewer channels than a
    block, the lanes and zeros by layout/loops.last_block_in. The kernel, ms (2 vCPUs, AVX-512 Xeon), oneDNN's
    generic reorder against this: batch 1 20 channels @56 0.069 -> 0.021, 24 @28 0.022 -> 0.011, 40 @28 0.032 ->
    0.012, 72 @56 0.107 -> 0.045, 3 @224 0.36 -> 0.22; batch 8 3 @224 1.99 -> 0.94. A batch of several blocks
    stays on oneDNN's reorder: one execution per image there lost (batch 8, 72 @56 0.34 -> 0.55, 17 @31 0.034 ->
    0.081)."""

    def run(self, x: np.ndarray, out: np.ndarray) -> None:
        n, c, h, w = x.shape
        self._reorders(x, out)
        parallel_for(LL.last_block_in, n, n * h * w * self.block, x.reshape(n, c, h * w),
                     out.reshape(n, out.shape[1], h * w, self.block), self.full)


def _kernel_to_blocked(backends: Backends, node: Node, ins: list[TensorInfo]):
    return reorder(backends.onednn, True, layout_params(node)[0], np.dtype(ins[0].dtype))


def _kernel_to_plain(backends: Backends, node: Node, ins: list[TensorInfo]):
    return reorder(backends.onednn, False, layout_params(node)[0], np.dtype(ins[0].dtype))


def _kernel_global(backends: Backends, node: Node, ins: list[TensorInfo]):
    is_max = node.params.get("mode") == "max"
    if np.dtype(ins[0].dtype) != np.float32:
        return reference_fallback(node, global_reference)
    LL.global_pool(np.zeros((1, 1, 1), np.float32), np.zeros((1, 1), np.float32), is_max, 0, 1)  # compile now

    def run(inputs, outputs, workspace):
        x = np.ascontiguousarray(inputs[0])
        n, cb, h, w, b = x.shape
        parallel_for(LL.global_pool, n * cb, x.size, x.reshape(n * cb, h * w, b), outputs[0].reshape(n * cb, b),
                     is_max)
    run.impl = "numba:global_pool_blocked"  # type: ignore[attr-defined]
    if backends.onednn:  # oneDNN's jit pooling, the window the whole plane: ~3x the loop
        pool = Node("MaxPool" if is_max else "AvgPool", node.name, source=node.source)

        def geom(_, shape):
            window = {"kernel": (shape[2], shape[3]), "stride": (1, 1), "pads": (0, 0, 0, 0)}
            return pool_geom(Node(pool.op_type, node.name, params=window), lanes_as_channels(shape))
        return onednn_pool.build(pool, ins, geom, run, int(ins[0].shape[4]))
    return run


def _kernel_maxpool(backends: Backends, node: Node, ins: list[TensorInfo]):
    if np.dtype(ins[0].dtype) != np.float32:
        return reference_fallback(node, maxpool_reference_blocked)
    LL.max_pool(np.zeros((1, 1, 1, 1), np.float32), np.zeros((1, 1, 1, 1), np.float32), 1, 1, 1, 1, 1, 1, 0, 0, 0, 1)
    plain = as_maxpool(node)
    geoms: dict[tuple[int, ...], object] = {}  # per input shape, so a run computes no geometry

    def geometry(shape: tuple[int, ...]):
        g = geoms.get(shape)
        if g is None:
            n, cb, h, w, b = shape
            g = remember(geoms, shape, pool_geom(plain, (n, cb * b, h, w)))
        return g

    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        n, cb, h, w, b = x.shape
        g = geometry(x.shape)
        parallel_for(LL.max_pool, n * cb, out.size * g.kernel[0] * g.kernel[1], x.reshape(n * cb, h, w, b),
                     out.reshape(n * cb, g.oh, g.ow, b), *g.kernel, *g.stride, *g.dilation, g.pads[0], g.pads[1])
    run.impl = "numba:max_pool_blocked"  # type: ignore[attr-defined]

    def exact_if_flagged(x: np.ndarray, out: np.ndarray, flags: np.ndarray) -> tuple[tuple, np.ndarray]:
        """The record of `run`'s exact loop over x into out where `flags` (a NaN check's) say so, and its job."""
        n, cb, h, w, b = x.shape
        g = geometry(x.shape)
        job = region_job(LL.MPF_LEN)
        job[LL.MPF_FLAGS:LL.MPF_X] = flags.ctypes.data, flags.size
        job[LL.MPF_X:LL.MPF_OUT] = D.address(x), n * cb, h, w, b
        job[LL.MPF_OUT:LL.MPF_WINDOW] = D.address(out), g.oh, g.ow
        job[LL.MPF_WINDOW:] = *g.kernel, *g.stride, *g.dilation, g.pads[0], g.pads[1]
        return (N.OP_CALL, LL.max_pool_if_flagged().address, job.ctypes.data), job

    if backends.onednn:  # oneDNN's jit pooling on nChw{B}c: 64ch@111 b1 0.57 -> 0.10 ms
        block = int(ins[0].shape[4])
        LL.max_pool_if_flagged()  # compiled (or loaded) now, not in a request
        return onednn_pool.build(plain, ins, lambda _, shape: pool_geom(plain, lanes_as_channels(shape)), run,
                                  block, exact_if_flagged)
    return run


def _kernel_broadcast(backends: Backends, node: Node, ins: list[TensorInfo]):
    if any(np.dtype(i.dtype) != np.float32 for i in ins):
        return reference_fallback(node, broadcast_reference)
    code = BROADCAST_OPS[node.params["op"]][0]
    LL.broadcast_binary(np.zeros((1, 1, 1), np.float32), np.zeros((1, 1), np.float32), np.zeros((1, 1, 1), np.float32),
                     code, False, 0, 1)

    def run(inputs, outputs, workspace):
        s_first = broadcast_operands(node, (inputs[0].shape, inputs[1].shape))
        x, s = (inputs[1], inputs[0]) if s_first else (inputs[0], inputs[1])
        x, s = np.ascontiguousarray(x), np.ascontiguousarray(s)
        n, cb, h, w, b = x.shape
        parallel_for(LL.broadcast_binary, n * cb, x.size, x.reshape(n * cb, h * w, b), s.reshape(n * cb, b),
                     outputs[0].reshape(n * cb, h * w, b), code, s_first)
    small_first = broadcast_operands(node, [i.shape for i in ins])
    if backends.onednn and onednn_binary.supported(node.params["op"], small_first):
        return onednn_binary.build(node.params["op"], small_first, run)
    return run


_REGROUP_CHUNK = 1024  # pixels per work item of copy_lanes: 64 KiB of a 16-lane block


class _Copy:
    """One (output, input) pair's lane map for copy_lanes, as runs of consecutive lanes (consecutive in the
    destination block and in the source's flat offsets), in flat offsets of one image's input."""

    def __init__(self, chans: list[tuple[int, int]], i: int, block: int, hw: int):
        dst_blocks = -(-len(chans) // block)
        self.count = np.zeros(dst_blocks, np.int64)
        self.run_dst = np.zeros((dst_blocks, block), np.int64)
        self.run_src = np.zeros((dst_blocks, block), np.int64)
        self.run_len = np.zeros((dst_blocks, block), np.int64)
        self.aligned = np.full(dst_blocks, -1, np.int64)
        lanes: list[list[tuple[int, int]]] = [[] for _ in range(dst_blocks)]  # (dst lane, flat source offset)
        for k, (j, c) in enumerate(chans):
            if j == i:
                db, lane = divmod(k, block)
                sb, sl = divmod(c, block)
                lanes[db].append((lane, sb * hw * block + sl))
        for db, pairs in enumerate(lanes):
            for lane, off in pairs:
                n = self.count[db]
                last = n - 1
                if n and self.run_dst[db, last] + self.run_len[db, last] == lane \
                        and self.run_src[db, last] + self.run_len[db, last] == off:
                    self.run_len[db, last] += 1
                    continue
                self.run_dst[db, n], self.run_src[db, n], self.run_len[db, n] = lane, off, 1
                self.count[db] += 1
            if self.count[db] == 1 and self.run_dst[db, 0] == 0 and self.run_len[db, 0] == block \
                    and self.run_src[db, 0] % block == 0:
                self.aligned[db] = self.run_src[db, 0]


# Destination floats from which one input's lane copies split as a native region (loops.copy_team): no thread enters
# Python, where from Python the second thread starts tens of microseconds late. Smaller copies stay on one thread:
# they are bound by memory and by reading what the other core just wrote, and split they ran slower (GhostNet's 20
# ghost concats at batch 1, in-process: 1.13 ms with the Python split from MIN_WORK, 1.42 split natively from 16K
# floats, 1.14 from 100K, 1.00 from 256K against 1.07).
NATIVE_COPY_FLOATS = 1 << 18


# The same for the permute path (permute_lanes), measured apart: ShuffleNetV2's concat-shuffle-splits at batch 1
# (50K and 25K floats a half) took 0.93x of the model's time split from 16K floats against from NATIVE_COPY_FLOATS.
NATIVE_PERMUTE_FLOATS = 1 << 14


def _splits_natively(dst: np.ndarray, least: int | None = None) -> bool:
    """Whether a lane job on dst runs as a native region: from `least` floats (NATIVE_COPY_FLOATS by default)."""
    return dst.size >= (NATIVE_COPY_FLOATS if least is None else least) and get_threads() >= 2 and native_regions()


def _copy_job(x: np.ndarray, dst: np.ndarray, c: _Copy, chunk: int) -> np.ndarray | None:
    """copy_team's job for x's lanes into dst (N, Cbd, HW, B) by the map `c`; None where it does not apply."""
    n, cbd, hw, b = dst.shape
    if not (x.dtype == dst.dtype == np.float32 and x.flags.c_contiguous and dst.flags.c_contiguous
            and x.shape[0] == n and c.count.shape == (cbd,) and c.run_dst.shape == (cbd, b)):
        return None
    job = region_job(LL.COPY_LEN)
    job[LL.COPY_N:LL.COPY_SRC] = n, x.size // max(n, 1), cbd, hw, b
    job[LL.COPY_SRC], job[LL.COPY_DST] = x.ctypes.data, dst.ctypes.data
    job[LL.COPY_COUNT:LL.COPY_CHUNK] = [a.ctypes.data for a in (c.count, c.run_dst, c.run_src, c.run_len, c.aligned)]
    job[LL.COPY_CHUNK] = chunk
    return job


def _native_copy(x: np.ndarray, dst: np.ndarray, c: _Copy, chunk: int) -> bool:
    """x's lanes into dst (N, Cbd, HW, B) by the map `c`, as one native region where it pays and applies; False,
    nothing run, otherwise (the caller splits from Python)."""
    if not _splits_natively(dst):
        return False
    job = _copy_job(x, dst, c, chunk)
    return job is not None and run_native(LL.copy_team().address, job)


# Steps a dst block may take on average for the permute path: each step sweeps the block's pixels once (load,
# permute, merge, store), so a map that scatters a block over many source blocks (a shuffle of many groups) is
# cheaper lane by lane.
PERMUTE_STEPS_PER_BLOCK = 4


class _Permute:
    """One output's lanes as permute_lanes' steps (loops.py): per dst block, one step per (input, source block) it
    reads, with that block's lane indices and the mask of the dst lanes it fills; independent of the plane size."""

    def __init__(self, chans: list[tuple[int, int]], block: int):
        start, s_in, s_blk, s_idx, s_mask = [0], [], [], [], []
        for first in range(0, len(chans), block):
            steps: dict[tuple[int, int], list] = {}
            for lane, (i, c) in enumerate(chans[first:first + block]):
                step = steps.setdefault((i, c // block), [np.zeros(block, np.int32), 0])
                step[0][lane], step[1] = c % block, step[1] | 1 << lane
            for (i, sb), (idx, mask) in steps.items():
                s_in.append(i), s_blk.append(sb), s_idx.append(idx), s_mask.append(mask)
            start.append(len(s_in))
        self.start = np.array(start, np.int64)
        self.s_in, self.s_blk, self.s_mask = (np.array(a, np.int64) for a in (s_in, s_blk, s_mask))
        self.s_idx = np.array(s_idx, np.int32).reshape(len(s_in), block)

    @property
    def pays(self) -> bool:
        return len(self.s_in) <= PERMUTE_STEPS_PER_BLOCK * (len(self.start) - 1)


def _sources(inputs) -> np.ndarray | None:
    """permute_lanes' (2, inputs) words: each input's address and floats per image; None unless all are contiguous
    float32."""
    if not all(x.dtype == np.float32 and x.flags.c_contiguous for x in inputs):
        return None
    return np.array([[x.ctypes.data for x in inputs], [x.size // max(x.shape[0], 1) for x in inputs]], np.int64)


def _permute_job(sources: np.ndarray, dst: np.ndarray, pm: _Permute, chunk: int) -> np.ndarray:
    """permute_team's job for dst (N, Cbd, HW, B) by the plan `pm` over the inputs in `sources`."""
    job = region_job(LL.PERM_LEN)
    job[LL.PERM_N:LL.PERM_DST] = dst.shape
    job[LL.PERM_DST], job[LL.PERM_INPUTS], job[LL.PERM_SOURCES] = dst.ctypes.data, sources.shape[1], \
        sources.ctypes.data
    job[LL.PERM_STEPS] = len(pm.s_in)
    job[LL.PERM_START:LL.PERM_CHUNK] = [a.ctypes.data for a in (pm.start, pm.s_in, pm.s_blk, pm.s_idx, pm.s_mask)]
    job[LL.PERM_CHUNK] = chunk
    return job


def _permute(sources: np.ndarray, dst: np.ndarray, pm: _Permute, chunk: int) -> None:
    """dst (N, Cbd, HW, B) from the inputs in `sources` by `pm`: one native region where it pays, else split from
    Python."""
    if _splits_natively(dst, NATIVE_PERMUTE_FLOATS):
        job = _permute_job(sources, dst, pm, chunk)
        if run_native(LL.permute_team().address, job):
            return
    n, cbd, hw, _ = dst.shape
    parallel_for(LL.permute_lanes, n * cbd * -(-hw // chunk), dst.size, sources, dst, pm.start, pm.s_in, pm.s_blk,
                 pm.s_idx, pm.s_mask, chunk)


def _one_record(fn: int, job: np.ndarray, dst: np.ndarray, chunk: int, least: int) -> tuple | None:
    """A lane job's record: a native region where the run would split it so (from `least` floats), a call on this
    thread where the run would not split it; None where the run would split from Python."""
    n, cbd, hw, _ = dst.shape
    if _splits_natively(dst, least):
        return T.region_record(fn, job.ctypes.data)
    if T.chunks_for(n * cbd * -(-hw // chunk), dst.size) <= 1:
        return (N.OP_CALL, fn, job.ctypes.data)
    return None


def _regroup_records(inputs, outputs, sources, copies_of, permutes, chunk: int) -> Native | None:
    """RegroupBlocked's run on these arrays as native_program records (fused_calls.py): each output's permute, or
    its padding zeroing and copies, as the run does them; None where the run would split from Python or a copy does
    not apply."""
    n, _, h, w, b = inputs[0].shape
    words = _sources(inputs)
    records, keep = [], [copies_of, permutes, words]
    for out, chans_out, copies, pm in zip(outputs, sources, copies_of, permutes, strict=True):
        if not out.flags.c_contiguous:
            return None
        dst = out.reshape(n, out.shape[1], h * w, b)
        if pm is not None:
            if words is None:
                return None
            jobs = [(LL.permute_team().address, _permute_job(words, dst, pm, chunk), NATIVE_PERMUTE_FLOATS)]
        else:
            jobs = []
            if len(chans_out) % b:
                job = region_job(LL.ZERO_LEN)
                job[LL.ZERO_N:LL.ZERO_DST] = dst.shape
                job[LL.ZERO_DST], job[LL.ZERO_FIRST] = dst.ctypes.data, len(chans_out) % b
                records.append((N.OP_CALL, LL.zero_team().address, job.ctypes.data))
                keep.append(job)
            for i, c in copies:
                job = _copy_job(inputs[i], dst, c, chunk)
                if job is None:
                    return None
                jobs.append((LL.copy_team().address, job, NATIVE_COPY_FLOATS))
        for fn, job, least in jobs:
            record = _one_record(fn, job, dst, chunk, least)
            if record is None:
                return None
            records.append(record)
            keep.append(job)
    return Native(records, [], keep)


def _kernel_regroup(backends: Backends, node: Node, ins: list[TensorInfo]):
    if any(np.dtype(i.dtype) != np.float32 for i in ins):
        return reference_fallback(node, regroup_reference)
    block, chans, sources = regroup_params(node)
    z, k = np.zeros((1, 1, 1, 1), np.float32), np.zeros((1, 1), np.int64)
    LL.copy_lanes(z.reshape(1, 1), z, k[0], k, k, k, k[0], 1, 0, 0)  # compile at build
    LL.zero_lanes(z, 1, 0, 0)
    LL.copy_team()  # compiled (or loaded) with the kernel, not on its first request
    LL.zero_team()
    # Each output by lane permutes where this CPU has the permute for the block natively and the map takes few
    # steps a block (a shuffle's single lanes, shifted concats), else by lane copies.
    permutes = [_Permute(out, block) for out in sources] if native_width(block) else [None] * len(sources)
    permutes = [pm if pm is not None and pm.pays else None for pm in permutes]
    if any(pm is not None for pm in permutes):
        LL.permute_lanes(np.zeros((2, 1), np.int64), z.reshape(1, 1, 1, 1), k[0][:1], k[0][:0], k[0][:0],
                         np.zeros((0, block), np.int32), k[0][:0], 1, 0, 0)
        LL.permute_team()
    plans: dict[tuple, list] = {}  # per H*W: the copies of each output (offsets depend on the plane size)

    def plan(hw: int) -> list:
        if hw not in plans:
            return remember(plans, hw, [[(i, _Copy(out, i, block, hw)) for i in sorted({i for i, _ in out})]
                                        for out in sources])
        return plans[hw]

    def fill(inputs, words, out, chans_out, copies, pm) -> None:
        n, _, h, w, b = inputs[0].shape
        dst = out.reshape(n, out.shape[1], h * w, b)
        if pm is not None and words is not None:
            _permute(words, dst, pm, _REGROUP_CHUNK)
            return
        if len(chans_out) % b:
            LL.zero_lanes(dst, len(chans_out) % b, 0, n)
        for i, c in copies:
            x = inputs[i]
            if _native_copy(x, dst, c, _REGROUP_CHUNK):
                continue
            chunks = -(-h * w // _REGROUP_CHUNK)
            parallel_for(LL.copy_lanes, n * dst.shape[1] * chunks, dst.size, x.reshape(n, -1), dst, c.count,
                         c.run_dst, c.run_src, c.run_len, c.aligned, _REGROUP_CHUNK)

    def run(inputs, outputs, workspace):
        h, w = inputs[0].shape[2:4]
        words = _sources(inputs)
        for out, chans_out, copies, pm in zip(outputs, sources, plan(h * w), permutes, strict=True):
            if out.flags.c_contiguous:
                fill(inputs, words, out, chans_out, copies, pm)
            else:  # the loops write through a reshaped view, which of a strided output would be a copy
                whole = np.empty(out.shape, out.dtype)
                fill(inputs, words, whole, chans_out, copies, pm)
                np.copyto(out, whole)

    def native(inputs, outputs, workspace):
        n, _, h, w, b = inputs[0].shape
        copies_of = plans.get(h * w)
        return None if copies_of is None else _regroup_records(inputs, outputs, sources, copies_of, permutes,
                                                                _REGROUP_CHUNK)

    run.native = native  # type: ignore[attr-defined]
    kinds = sorted({"permute_lanes" if pm is not None else "copy_lanes" for pm in permutes})
    run.impl = "numba:" + "+".join(kinds)  # type: ignore[attr-defined]
    return run


KERNELS = {
    "ToBlocked": CpuKernel(_kernel_to_blocked),
    "ToPlain": CpuKernel(_kernel_to_plain),
    "GlobalPoolBlocked": CpuKernel(_kernel_global),
    "MaxPoolBlocked": CpuKernel(_kernel_maxpool),
    "BroadcastBlocked": CpuKernel(_kernel_broadcast),
    "RegroupBlocked": CpuKernel(_kernel_regroup),
}
