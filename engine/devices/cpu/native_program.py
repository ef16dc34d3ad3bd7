"""A run of kernels as one native call: a program of records (which C function, with which arguments) that one small
LLVM function steps through.

Why: a model at batch 1 runs 50-250 kernels of 20-200 us each, and each one's Python (argument checks, plan lookups,
pointer arithmetic, a ctypes call per oneDNN function: 5-15 us) left OpenMP's other threads spinning idle; on
EfficientNet-B0 that Python was ~15% of a run. For a binding (fixed arena views, fixed primitives) the C calls a
kernel makes are the same every run, so a kernel that can say which ones (its `native` attribute, fused_calls.py)
is recorded once and replayed here: oneDNN executions, memory handles, OpenMP thread counts, our native regions
(numba cfuncs on OpenMP's team) and copies, with no Python between them.

A record is WORDS int64 words: the operation (OP_*), the function's address, up to four arguments and a status word.
The program function reads them as data, so its machine code holds no address of this process and is compiled once per
process (llvmlite's MCJIT, a few milliseconds). It returns 0, or 1 + the index of the record whose C function returned
a nonzero status (oneDNN's calls), the status then in that record's last word (its own: a failed program stays
runnable, though its callers drop it).
"""

from __future__ import annotations

import ctypes
import os
import threading

import llvmlite.binding as llvm
import numpy as np

OP_EXEC, OP_SET, OP_WAIT, OP_THREADS, OP_REGION, OP_CALL, OP_COPY = range(7)
WORDS = 7  # op, function, arguments a..d, and a word of its own for the status of a failed call
STATUS = 6

# Each operation's C signature (pointers as `ptr`, converted from the record's int64 words).
_IR = """
define i64 @nnserve_program(ptr %prog, i64 %n) {
entry:
  br label %head
head:
  %i = phi i64 [0, %entry], [%next, %cont]
  %more = icmp slt i64 %i, %n
  br i1 %more, label %body, label %done
body:
  %base = mul i64 %i, 7
  %p0 = getelementptr i64, ptr %prog, i64 %base
  %op = load i64, ptr %p0
  %p1 = getelementptr i64, ptr %p0, i64 1
  %fn = load i64, ptr %p1
  %p2 = getelementptr i64, ptr %p0, i64 2
  %a = load i64, ptr %p2
  %p3 = getelementptr i64, ptr %p0, i64 3
  %b = load i64, ptr %p3
  %p4 = getelementptr i64, ptr %p0, i64 4
  %c = load i64, ptr %p4
  %p5 = getelementptr i64, ptr %p0, i64 5
  %d = load i64, ptr %p5
  %p6 = getelementptr i64, ptr %p0, i64 6
  %f = inttoptr i64 %fn to ptr
  %pa = inttoptr i64 %a to ptr
  %pb = inttoptr i64 %b to ptr
  %pd = inttoptr i64 %d to ptr
  %c32 = trunc i64 %c to i32
  %a32 = trunc i64 %a to i32
  %d32 = trunc i64 %d to i32
  switch i64 %op, label %bad [
    i64 0, label %exec
    i64 1, label %set
    i64 2, label %wait
    i64 3, label %threads
    i64 4, label %region
    i64 5, label %call
    i64 6, label %copy
  ]
exec:
  %rc0 = call i32 %f(ptr %pa, ptr %pb, i32 %c32, ptr %pd)
  %ok0 = icmp eq i32 %rc0, 0
  br i1 %ok0, label %cont, label %fail
set:
  %rc1 = call i32 %f(ptr %pa, ptr %pb)
  %ok1 = icmp eq i32 %rc1, 0
  br i1 %ok1, label %cont, label %fail
wait:
  %rc2 = call i32 %f(ptr %pa)
  %ok2 = icmp eq i32 %rc2, 0
  br i1 %ok2, label %cont, label %fail
threads:
  call void %f(i32 %a32)
  br label %cont
region:
  call void %f(ptr %pa, ptr %pb, i32 %c32, i32 %d32)
  br label %cont
call:
  call void %f(ptr %pa)
  br label %cont
copy:
  %r6 = call ptr %f(ptr %pa, ptr %pb, i64 %c)
  br label %cont
bad:
  br label %fail
fail:
  %rc = phi i32 [%rc0, %exec], [%rc1, %set], [%rc2, %wait], [-1, %bad]
  %rc64 = sext i32 %rc to i64
  store i64 %rc64, ptr %p6
  %at = add i64 %i, 1
  ret i64 %at
cont:
  %next = add i64 %i, 1
  br label %head
done:
  ret i64 0
}
"""

_lock = threading.Lock()
_compiled: tuple | None = None  # (the MCJIT engine, kept alive; the program function)


def _after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # a thread of the parent that held it is not in the child


os.register_at_fork(after_in_child=_after_fork)


def program_function() -> ctypes._CFuncPtr:
    """The compiled program function, int64 fn(int64 *records, int64 count) (compiled on first use)."""
    global _compiled
    if _compiled is not None:
        return _compiled[2]
    with _lock:
        if _compiled is None:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            module = llvm.parse_assembly(_IR)
            module.verify()
            machine = llvm.Target.from_default_triple().create_target_machine(opt=2)
            jit = llvm.create_mcjit_compiler(module, machine)
            jit.finalize_object()
            address = jit.get_function_address("nnserve_program")
            fn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)(address)
            _compiled = (jit, module, fn)
        return _compiled[2]


def copy_record(dst: int, src: int, nbytes: int) -> tuple[int, ...]:
    """memmove(dst, src, nbytes) as a record."""
    return (OP_COPY, address_of(ctypes.memmove), dst, src, nbytes)


def address_of(fn) -> int:
    """The address of a ctypes function (a library's symbol or a CFUNCTYPE instance)."""
    return ctypes.cast(fn, ctypes.c_void_p).value


class Program:
    """Records (tuples of up to WORDS ints: op, function, arguments) as one int64 array, run in one call. `keep`
    holds what the records point into (jobs, argument arrays) for as long as the program lives."""

    def __init__(self, records: list[tuple[int, ...]], keep: list):
        self.words = np.zeros((max(len(records), 1), WORDS), np.int64)
        for i, r in enumerate(records):
            self.words[i, :len(r)] = r
        self.count = len(records)
        self.keep = keep
        self._fn = program_function()
        self._ptr = self.words.ctypes.data

    def patch(self, rows: np.ndarray, column: int, value: int) -> None:
        """Sets one argument of several records (a stream handle that belongs to the calling thread)."""
        self.words[rows, column] = value

    def run(self) -> tuple[int, int] | None:
        """Runs every record (the GIL released); None, or (index, status) of the record whose call failed."""
        failed = self._fn(self._ptr, self.count)
        if failed == 0:
            return None
        return failed - 1, int(self.words[failed - 1, STATUS])
