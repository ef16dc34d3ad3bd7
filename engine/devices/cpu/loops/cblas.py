"""cblas_sgemm called from numba code, without the GIL: a kernel that loops over many small GEMMs (attention's
heads) makes one nogil call per thread instead of one Python call, and one GIL hand-over, per GEMM.

The function is the BLAS library's own cblas_sgemm, given as an address (blas.py finds it in the library numpy
uses); the call is emitted as LLVM IR on that address, so the compiled code does not bake the address in and
stays cacheable across processes. `wide` says whether the library's integers are 64-bit (ILP64, as numpy's
bundled OpenBLAS) or 32-bit: the two calls differ in the arguments' width.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


def _call_of(bits: int):
    """An intrinsic calling cblas_sgemm at an address, with `bits`-wide integer arguments."""

    @intrinsic
    def call(typingctx, fn, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc):
        sig = types.void(fn, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc)

        def codegen(context, builder, signature, args):
            i32, wide, f32 = ir.IntType(32), ir.IntType(bits), ir.FloatType()
            ptr = ir.IntType(8).as_pointer()
            fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, wide, wide, wide, f32, ptr, wide, ptr, wide, f32,
                                                   ptr, wide])

            def integer(v):  # every integer argument arrives as int64 (the njit wrapper casts)
                return builder.trunc(v, wide) if bits < 64 else v

            f, tb, m_, n_, k_, al, a_, lda_, b_, ldb_, c_, ldc_ = args
            target = builder.inttoptr(f, fnty.as_pointer())
            builder.call(target, [ir.Constant(i32, ROW_MAJOR), ir.Constant(i32, NO_TRANS), builder.trunc(tb, i32),
                                  integer(m_), integer(n_), integer(k_), al, builder.inttoptr(a_, ptr),
                                  integer(lda_), builder.inttoptr(b_, ptr), integer(ldb_), ir.Constant(f32, 0.0),
                                  builder.inttoptr(c_, ptr), integer(ldc_)])
            return context.get_dummy_value()

        return sig, codegen

    return call


_sgemm64, _sgemm32 = _call_of(64), _call_of(32)


@njit(nogil=True, cache=True)
def sgemm(fn, wide, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc):
    """c (m x n, row stride ldc) = alpha * a (m x k) @ b (k x n; with trans_b, b is n x k and read transposed),
    row-major, every stride in elements; a, b and c are addresses. `fn` is cblas_sgemm's address, `wide` whether
    its integers are 64-bit."""
    tb = np.int64(TRANS if trans_b else NO_TRANS)
    args = (np.int64(m), np.int64(n), np.int64(k), np.float32(alpha), np.int64(a), np.int64(lda), np.int64(b),
            np.int64(ldb), np.int64(c), np.int64(ldc))
    if wide:
        _sgemm64(np.int64(fn), tb, *args)
    else:
        _sgemm32(np.int64(fn), tb, *args)


@intrinsic
def _f32_pointer(typingctx, address):
    """The float32 pointer at an integer address."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.FloatType().as_pointer())
    return types.CPointer(types.float32)(address), codegen


@njit(nogil=True, cache=True)
def address(a):
    """a.ctypes.data, for an array view made per run: 0.5 us here against 2-3 us through numpy's ctypes object."""
    return a.ctypes.data


@njit(nogil=True, cache=True)
def row_at(address, n):
    """The n float32 at `address` as a contiguous array view (a row written through an address by a GEMM)."""
    return carray(_f32_pointer(np.int64(address)), (n,))
