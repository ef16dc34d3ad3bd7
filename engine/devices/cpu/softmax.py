"""CPU kernel of Softmax and LogSoftmax (engine/ops/softmax.py): a numba loop over an (outer, n, inner) view in
float64; a float32 Softmax over the last axis runs float32 loops whose exp is vectorised, split over rows: rows of
up to SHORT_ROW entries (a detector's class scores) take one exp pass across rows, longer ones one row at a time.
Where OpenMP's threads spin through a request (threads.native_regions) a split runs as one native region
(loops/attention.softmax_team), no thread entering Python, and a native program records it. LogSoftmax over
the last axis runs oneDNN's primitive on large float32 inputs."""

from __future__ import annotations

import math

import numpy as np

from engine.devices.cpu.fused_calls import Native, team_record
from engine.devices.cpu.kernel import Backends, CpuKernel, empty, numba_ok, reference_fallback
from engine.devices.cpu.loops import attention as LA
from engine.devices.cpu.loops.attention import long_rows_softmax, short_rows_softmax
from engine.devices.cpu.loops.normalize import softmax_loop
from engine.devices.cpu.onednn import unary
from engine.devices.cpu.threads import (
    LastJob,
    chunks_for,
    native_regions,
    parallel_for,
    region_job,
    regions_callable,
    run_alone,
    run_native,
)
from engine.ir import Node
from engine.ops.registry import TensorInfo
from engine.ops.rules import float_of
from engine.ops.softmax import axis_of, reference

# Rows up to this long run `short_rows_softmax` (its exp vectorised across rows), longer ones `long_rows_softmax`
# (one row at a time). An AVX-512 EPYC, 2 vCPUs, each kernel on the threads it picks; us for 8,840 floats as
# (8840 / n, n), oneDNN's primitive / the float64 loop / short rows: n = 2 (UltraFace's class scores) 124 / 77 / 36,
# 4: 69 / 56 / 24, 16: 19 / 46 / 11, 64: 15 / 46 / 9. One thread, short / long rows: (500, 8) 5.4 / 10.5, (64, 64)
# 3.3 / 4.8, (32, 128) 3.5 / 3.5, (1, 1000) 1.3 / 0.8, (2364, 197) 422 / 326. Long rows split over two threads
# against oneDNN's primitive (which the float32 Softmax ran from 8K elements before): (2364, 197) 207 / 232,
# (64, 1000) 28 / 60, (256, 256) 41 / 61, (8, 4096) 14 / 32.
SHORT_ROW = 64


def _view3(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    return math.prod(shape[:axis]), (shape[axis] if shape else 1), math.prod(shape[axis + 1:])


def _kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    loop = _loop_kernel(node, ins)
    shape = tuple(ins[0].shape)
    last_axis = bool(shape) and axis_of(node, len(shape)) == len(shape) - 1
    if last_axis and node.op_type == "Softmax" and np.dtype(ins[0].dtype) == np.float32:
        return _rows_kernel(loop)
    if backends.onednn and np.dtype(ins[0].dtype) == np.float32 and last_axis:
        def rows(s: tuple[int, ...]) -> tuple[int, int]:
            return math.prod(s[:-1]), s[-1]
        return unary.build(unary.softmax_desc(True, 1), rows, loop, "log_softmax", shape)
    return loop


def _rows_kernel(loop):
    """Softmax over the last axis in float32, rows of every length (SHORT_ROW picks the loop). `loop` takes what
    the row loops cannot: an empty input, and an output that is not one contiguous buffer (its reshape would be a
    copy, and the result lost)."""
    z = np.zeros((1, 2), np.float32)
    short_rows_softmax(z, z, 0, 1)  # compile at build
    long_rows_softmax(z, z, 0, 1)
    LA.softmax_team()
    last = LastJob()

    def run(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        n = x.shape[-1] if x.ndim else 0
        if x.size == 0 or n == 0 or not out.flags.c_contiguous:
            loop(inputs, outputs, workspace)
            return
        x2 = np.ascontiguousarray(x).reshape(-1, n)
        rows = x2.shape[0]
        # over Python callbacks where regions do not run (no records then), or on the dispatcher without OpenMP
        if chunks_for(rows, x2.size) > 1 and not native_regions() or not regions_callable():
            parallel_for(short_rows_softmax if n <= SHORT_ROW else long_rows_softmax, rows, x2.size, x2,
                         out.reshape(-1, n))
            return
        # the cfunc a native program's record calls, for the same bits (threads.run_alone): its sums' reductions
        # are vectorised per compilation, and the dispatcher's compilation rounded in the last bit otherwise
        # x2 is a view of x's memory where x is contiguous, else a copy made for this run (not kept)
        job = last.get(x, out, lambda: _job(x2, out), keep=x.flags.c_contiguous)
        if chunks_for(rows, x2.size) <= 1 or not run_native(LA.softmax_team().address, job):
            run_alone(LA.softmax_team().address, job)  # one chunk, or the team busy

    def native_rebound(inputs, outputs, workspace, reads: tuple[int, ...] = (),
                       writes: tuple[int, ...] = ()) -> Native | None:
        """The rows' loop as a record of native programs (the split `run` makes); where the input is the caller's
        array (`reads` (0,)) or the output a fresh one (`writes` (0,): a detector's class scores, a graph's
        output) its job word is rebound before each replay."""
        x, out = inputs[0], outputs[0]
        if not (x.dtype == out.dtype == np.float32 and x.ndim and x.shape == out.shape and x.size
                and x.flags.c_contiguous and out.flags.c_contiguous) or reads not in ((), (0,)):
            return None
        job = _job(x.reshape(-1, x.shape[-1]), out)
        record = team_record(LA.softmax_team().address, job, int(job[LA.SM_ROWS]), x.size)
        if record is None:
            return None
        return Native([record], [], [job], [(0, job, LA.SM_X)] if reads else [],
                      out_rebinds=[(0, job, LA.SM_OUT)] if writes else [])

    run.native = native_rebound  # type: ignore[attr-defined]
    run.native_rebound = native_rebound  # type: ignore[attr-defined]
    # a graph's output (runtime/bind.py): its job's word, written before each replay
    run.writes_fresh = lambda out: True  # type: ignore[attr-defined]
    run.impl = "numba:rows-f32"  # type: ignore[attr-defined]
    return run


def _job(x2: np.ndarray, out: np.ndarray) -> np.ndarray:
    """softmax_team's job for the rows of x2 (rows, n), contiguous float32, into out (as many, contiguous)."""
    job = region_job(LA.SM_LEN)
    job[LA.SM_ROWS], job[LA.SM_N] = x2.shape
    job[LA.SM_X], job[LA.SM_OUT], job[LA.SM_LONG] = x2.ctypes.data, out.ctypes.data, x2.shape[1] > SHORT_ROW
    return job


def _loop_kernel(node: Node, ins: list[TensorInfo]):
    if not numba_ok(ins[0].dtype):
        return reference_fallback(node, reference)
    log = node.op_type == "LogSoftmax"
    axis = axis_of(node, len(ins[0].shape))  # the rank is fixed for an instance; only the sizes vary
    softmax_loop(empty(3, ins[0].dtype), empty(3, float_of(ins[0].dtype)), log, False)

    def run(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        if x.ndim == 0:
            out[...] = 0.0 if log else 1.0
            return
        view = _view3(x.shape, axis)
        softmax_loop(np.ascontiguousarray(x).reshape(view), out.reshape(view), log, False)
    return run


KERNELS = {"Softmax": CpuKernel(_kernel), "LogSoftmax": CpuKernel(_kernel)}
