"""The keep-warm loop (warm_cpus.py): while runs are in progress, poll on the CPU's spin-wait hint; when none is,
sleep in the kernel on a futex until the count changes (or a timeout passes). All of it without the GIL, so a
thread running it at idle priority never holds, nor waits for, the interpreter lock once started: were it to wait
for the GIL after being woken on a busy host, the request thread would be made to hand the GIL to a thread that
gets no CPU (an inversion of priorities).

The futex is reached through libc's syscall(2), the one portable door to it (glibc exports no futex wrapper). Only
Linux on x86-64 and AArch64, whose syscall numbers are below; elsewhere SUPPORTED is False and nothing here runs.
"""

from __future__ import annotations

import ctypes
import platform
import sys

from numba import njit

from engine.devices.cpu.loops.spin import cpu_relax

_FUTEX_SYSCALL = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
SUPPORTED = sys.platform.startswith("linux") and _FUTEX_SYSCALL is not None
FUTEX_WAIT_PRIVATE = 128  # FUTEX_WAIT | FUTEX_PRIVATE_FLAG: the word is this process's own
FUTEX_WAKE_PRIVATE = 129  # FUTEX_WAKE | FUTEX_PRIVATE_FLAG
SYS_FUTEX = _FUTEX_SYSCALL or 0

# syscall(long number, ...): the six arguments a futex call takes, addresses as size_t (the same registers as
# pointers on both ABIs above; glibc's syscall is a register shuffle, not a va_arg reader).
_syscall = ctypes.CDLL(None, use_errno=True).syscall if SUPPORTED else None
if _syscall is not None:
    _syscall.restype = ctypes.c_long
    _syscall.argtypes = [ctypes.c_long, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_size_t,
                         ctypes.c_size_t, ctypes.c_int]


def futex_wake(address: int) -> None:
    """Wakes every thread sleeping on the 32-bit word at `address`."""
    _syscall(SYS_FUTEX, address, FUTEX_WAKE_PRIVATE, 0x7FFFFFFF, 0, 0, 0)


@njit(nogil=True)
def keep_warm(word, stop, timeout, grace):
    """Until stop[0] is set: spin while word[0] (runs in progress) is non-zero and `grace` polls after it drops to
    zero; then sleep while it stays zero, `timeout` (a timespec: seconds, nanoseconds) at most per sleep, so that
    a wake-up lost to a race costs that much and no more. Not cached: it calls a ctypes function."""
    left = grace
    while stop[0] == 0:
        if word[0] != 0:
            left = grace
        elif left > 0:
            left -= 1
        else:
            _syscall(SYS_FUTEX, word.ctypes.data, FUTEX_WAIT_PRIVATE, 0, timeout.ctypes.data, 0, 0)
            left = grace
            continue
        cpu_relax()
