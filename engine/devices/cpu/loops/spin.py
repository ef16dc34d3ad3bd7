"""Bounded spin-waits for the kernel thread pool (threads.py), run without the GIL.

A waiting thread polls a word with the CPU's spin-wait hint between reads (x86 `pause`, Arm `yield`: what libgomp
and ONNX Runtime spin on), for a bounded number of polls, then returns so the caller can sleep on a condition
variable. The hint is emitted as inline assembly with a memory clobber, which also keeps LLVM from hoisting the
load out of the loop (numba has no volatile loads).
"""

from __future__ import annotations

import platform

import llvmlite.binding as llvm
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

_HINTS = {"x86_64": "pause", "AMD64": "pause", "i686": "pause", "aarch64": "yield", "arm64": "yield"}
HINT = _HINTS.get(platform.machine(), "")  # no hint elsewhere: a plain compiler barrier
llvm.initialize_native_asmparser()  # numba's JIT only parses inline assembly once this is set up


@intrinsic
def cpu_relax(typingctx):
    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.VoidType(), [])
        builder.call(ir.InlineAsm(fnty, HINT, "~{memory}", side_effect=True), [])
        return context.get_dummy_value()
    return types.void(), codegen


@njit(nogil=True, cache=True)
def spin_while_equal(word, old, park, polls):
    """Polls word[0] up to `polls` times; True as soon as it differs from `old`, False at the end or as soon as
    park[0] is set (the caller then sleeps)."""
    for _ in range(polls):
        if word[0] != old:
            return True
        if park[0] != 0:
            return False
        cpu_relax()
    return word[0] != old


@njit(nogil=True, cache=True)
def spin_until_done(done, go, stride, count, polls):
    """Polls until done[i * stride] == go[i * stride] for every i < count, up to `polls` times; True if so."""
    for _ in range(polls):
        finished = True
        for i in range(count):
            if done[i * stride] != go[i * stride]:
                finished = False
                break
        if finished:
            return True
        cpu_relax()
    return False


@njit(nogil=True, cache=True)
def spin_while_running(word, old, park, active, grace, cap):
    """Polls word[0] while a run is in progress (active[0] > 0) and `grace` polls after it, `cap` polls at most;
    True as soon as it differs from `old`, False when the grace or the cap is spent or park[0] is set."""
    left = grace
    for _ in range(cap):
        if word[0] != old:
            return True
        if park[0] != 0:
            return False
        if active[0] > 0:
            left = grace
        else:
            left -= 1
            if left <= 0:
                break
        cpu_relax()
    return word[0] != old
