"""Intrinsics for native code that numba compiles from addresses: a region function's `void *` argument read as
int64 words, integer addresses as int64 or float32 pointers, and C functions called at an address (OpenMP's
omp_get_thread_num and omp_get_num_threads, oneDNN's primitive execution and stream wait, whose addresses a job
passes in, so nothing process-specific is compiled into a cached function).

These are inlined into their callers in other files; numba_cache.py keys the cache on every engine source, so a
change here recompiles them (numba alone would watch the caller's own file only).
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import carray, cfunc, njit, types
from numba.extending import intrinsic


@intrinsic
def i64_view(typingctx, ptr):
    """A void pointer (the region function's argument) as an int64 pointer."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64).as_pointer())
    return types.CPointer(types.int64)(ptr), codegen


def _pointer_at(element, stored: ir.Type, what: str):
    """An intrinsic: the pointer to `element`s (numba type; `stored`, its in-memory LLVM type) at an integer
    address."""
    @intrinsic
    def at(typingctx, address):
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], stored.as_pointer())
        return types.CPointer(element)(address), codegen
    at.__doc__ = f"The {what} pointer at an integer address."
    return at


i64_at = _pointer_at(types.int64, ir.IntType(64), "int64")
i32_at = _pointer_at(types.int32, ir.IntType(32), "int32")
i8_at = _pointer_at(types.int8, ir.IntType(8), "int8")
bool_at = _pointer_at(types.boolean, ir.IntType(8), "numpy bool (one byte each, numba's in-memory booleans)")
f32_at = _pointer_at(types.float32, ir.FloatType(), "float32")
f64_at = _pointer_at(types.float64, ir.DoubleType(), "float64")


@intrinsic
def call_int(typingctx, address):
    """int fn(void) at an integer address (omp_get_thread_num, omp_get_num_threads), widened to int64."""
    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(32), [])
        return builder.sext(builder.call(builder.inttoptr(args[0], fnty.as_pointer()), []), ir.IntType(64))
    return types.int64(address), codegen


@intrinsic
def call_int_p(typingctx, address, a):
    """int fn(void *a) at an integer address (oneDNN's dnnl_stream_wait), widened to int64."""
    def codegen(context, builder, signature, args):
        ptr = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.IntType(32), [ptr])
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        return builder.sext(builder.call(fn, [builder.inttoptr(args[1], ptr)]), ir.IntType(64))
    return types.int64(address, a), codegen


@intrinsic
def call_int_ppip(typingctx, address, a, b, n, c):
    """int fn(void *a, void *b, int n, void *c) at an integer address (oneDNN's dnnl_primitive_execute: primitive,
    stream, argument count, arguments), widened to int64."""
    def codegen(context, builder, signature, args):
        ptr, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fnty = ir.FunctionType(i32, [ptr, ptr, i32, ptr])
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        call = [builder.inttoptr(args[1], ptr), builder.inttoptr(args[2], ptr), builder.trunc(args[3], i32),
                builder.inttoptr(args[4], ptr)]
        return builder.sext(builder.call(fn, call), ir.IntType(64))
    return types.int64(address, a, b, n, c), codegen


def region(fn):
    """`fn(data)` as a native OpenMP region function (void fn(void *data), a numba cfunc: no Python, no GIL, cached on
    disk by numba), compiled (or loaded from numba's cache) on the first call of the returned function, which returns
    it from then on (its `.address` goes to threads.run_native; being kept here keeps its code alive). Kernels call
    it at build, so that no request pays for the compilation."""

    @functools.cache
    def compiled():
        return cfunc(types.void(types.voidptr), nogil=True, cache=True, error_model="numpy")(fn)
    compiled.__doc__ = fn.__doc__
    return compiled


def status_check(fn):
    """`fn(data)` as `int fn(void *data)` (a numba cfunc), compiled or loaded on the first call of the returned
    function as `region` does: a native program's OP_WAIT record calls it after a region whose job holds status
    words, and a nonzero return fails the program (fused_calls.Segment then names the node and drops it)."""

    @functools.cache
    def compiled():
        return cfunc(types.int32(types.voidptr), nogil=True, cache=True, error_model="numpy")(fn)
    compiled.__doc__ = fn.__doc__
    return compiled


@njit(inline="always")
def team_share(n, t, team):
    """Thread t's items [lo, hi) of n split evenly over a team of `team` (parallel_for's even chunks; a share may be
    empty where the team outnumbers the items)."""
    return t * n // team, (t + 1) * n // team


@njit(inline="always")
def open_job(data, length):
    """(the region job's `length` int64 words, this thread's number, the team's size >= 1): every job holds the
    addresses of omp_get_thread_num and omp_get_num_threads in its words 0 and 1."""
    job = carray(i64_view(data), (length,))
    return job, call_int(job[0]), max(call_int(job[1]), 1)
