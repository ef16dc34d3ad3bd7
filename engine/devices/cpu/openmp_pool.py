"""Our kernels' chunks on OpenMP's team (the `run` wait policy, threads.py): one pool for the whole engine.

oneDNN runs its primitives on OpenMP's threads; with a pool of our own beside them, two sets of idle threads
wait for the next op, and spinning ones of both would take turns on the same cores. Here a parallel_for is an
OpenMP parallel region (GOMP_parallel, the entry point gcc compiles `#pragma omp parallel` to, which Intel's
runtime implements too: onednn/binding.py) whose every thread runs a ctypes callback: the chunks for its thread
number. The team is the caller's own (the one its oneDNN primitives use), so its threads' wait policy
(KMP_BLOCKTIME or GOMP_SPINCOUNT, set before the runtime loaded) is the engine's one policy.

A callback runs Python, so an OpenMP thread holds the GIL to dispatch its chunk (the numba kernel releases it).
Each callback on an OpenMP thread makes its Python thread state and deletes it at the end (ctypes' own
PyGILState_Ensure / Release): none is kept between regions, because libgomp ends OpenMP threads on its own (a region
that asks for fewer threads than the team has ends the surplus ones; a paused team, threads.release_thread; the team
of a master thread that exits), and a thread that ended holding a state would leak it; a state kept per thread id
could also be taken for a new thread's that reuses the id. Keeping one and giving it back before every end libgomp
may choose (a count change, a smaller oneDNN region) has no safe hook (a thread-exit destructor runs after CPython's
own key is cleared), and the per-callback state costs 1-4% at batch 1 (bench/RESULTS.md, Engine before/after,
2026-11-27 17:31: DeiT-tiny 1.037x, GhostNet 1.032x, geomean of four 1.019x): a leak or a crash is the worse
defect. Our own regions always ask for the whole team, so they never end threads they will need again.

That dispatch is serial: each thread takes the GIL in turn for its chunk's Python, and a thread that waits for it
sleeps and is woken (tens of microseconds on a VM). The grouped attention's split started its second chunk 25-45 us
after the first and ran slower than one thread (MobileViT-XXS's 64-token attention: 0.19-0.25 ms split, 0.16 one
thread). `run_native` runs a native region function instead (a numba cfunc, loops/attention.py's `attend_team`):
no thread enters Python.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

import numpy as np

from engine.devices.cpu.native_program import OP_REGION

_Callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def chunk_indices(thread: int, threads: int, chunks: int) -> range:
    """The chunks OpenMP thread `thread` of `threads` runs: every threads-th from its own number."""
    return range(thread, chunks, threads)


class OpenMPPool:
    """The SpinPool interface (run, park, close) over OpenMP's team; `lib` resolves the OpenMP runtime's symbols
    (onednn/binding.OMP)."""

    def __init__(self, lib: ctypes.CDLL, threads: int):
        self.threads = threads
        self.park = np.zeros(8, np.int64)  # never read: OpenMP's threads are the ones oneDNN runs on
        self._parallel = lib.GOMP_parallel
        self._parallel.restype = None
        self._parallel.argtypes = [_Callback, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        self._thread_num = lib.omp_get_thread_num
        self._thread_num.restype = ctypes.c_int
        self._num_threads = lib.omp_get_num_threads
        self._num_threads.restype = ctypes.c_int
        self._callback = _Callback(self._chunks)  # kept alive as long as the pool
        # the same entry point for a native region function (a numba cfunc: no Python, no GIL on any thread)
        self._parallel_native = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint,
                                                 ctypes.c_uint)(ctypes.cast(lib.GOMP_parallel, ctypes.c_void_p).value)
        self._job: tuple | None = None
        self._errors: list[BaseException] = []
        self.busy = threading.Lock()  # one region at a time; a concurrent caller runs its loop alone

    def _chunks(self, _data) -> None:
        fn, args, bounds = self._job
        try:
            # the team OpenMP really gave (it may give fewer threads than asked): every chunk still runs
            for i in chunk_indices(self._thread_num(), self._num_threads(), len(bounds)):
                fn(*args, *bounds[i])
        except BaseException as e:  # handed to the caller, which raises it (a callback cannot raise)
            self._errors.append(e)

    def run(self, fn: Callable[..., None], args: tuple, bounds: list[tuple[int, int]]) -> bool:
        """fn(*args, lo, hi) for every (lo, hi) in bounds, over the team; False (nothing run) when another thread
        is using the pool."""
        if not self.busy.acquire(blocking=False):
            return False
        try:
            self._job = (fn, args, bounds)
            # ctypes lets the GIL go for the region; the whole team, whatever the chunks: a smaller region would end
            # the surplus threads, and the next full one would start them again (a thread each, ~0.1 ms)
            self._parallel(self._callback, None, self.threads, 0)
            self._job = None
            if self._errors:
                error = self._errors[0]
                self._errors.clear()
                raise error
        finally:
            self.busy.release()
        return True

    def run_native(self, fn: int, data: int) -> bool:
        """The native function at address `fn` (void fn(void *data)) on every thread of the team, each reading its
        share from `data` by its OpenMP thread number; False (nothing run) when another thread is using the pool.
        The function must not raise and must handle a team smaller than asked (OpenMP may give fewer threads)."""
        if not self.busy.acquire(blocking=False):
            return False
        try:
            self._parallel_native(fn, data, self.threads, 0)  # ctypes lets the GIL go for the region
        finally:
            self.busy.release()
        return True

    def region_record(self, fn: int, data: int) -> tuple[int, ...]:
        """run_native(fn, data)'s region as a native_program record (the caller holds `busy`)."""
        return (OP_REGION, ctypes.cast(self._parallel_native, ctypes.c_void_p).value, fn, data, self.threads, 0)

    def close(self) -> None:
        """Nothing to stop: the threads are OpenMP's."""
