"""Our kernels' chunks on OpenMP's team (the `run` wait policy, threads.py): one pool for the whole engine.

oneDNN runs its primitives on libgomp's threads; with a pool of our own beside them, two sets of idle threads
wait for the next op, and spinning ones of both would take turns on the same cores. Here a parallel_for is a
libgomp parallel region (GOMP_PARALLEL, the entry point `#pragma omp parallel` compiles to) whose every thread
runs a ctypes callback: the chunks for its thread number. The team is the caller's own (the one its oneDNN
primitives use), so its threads' wait policy (GOMP_SPINCOUNT, set before libgomp loaded) is the engine's one policy.

A callback runs Python, so an OpenMP thread holds the GIL to dispatch its chunk (the numba kernel releases it);
each thread keeps the Python thread state its first callback made (one more PyGILState_Ensure), so later regions
do not create and delete one each time (2-4% of DeiT-tiny's and GhostNet's time at batch 1 on 2 vCPUs). The mark
that a state is kept lives in that state (`_LOCAL`), so a new thread that reuses an ended one's id never looks kept.
A thread ending with its state leaks it, and libgomp ends OpenMP threads on its own: our regions therefore always
ask for the whole team (a smaller region ends the surplus threads), and before a team is let go
(threads.release_thread) its threads give their states back (`forget_team`). What is left: a team that oneDNN runs
on fewer threads than it has (not seen on the real-world suite at 8 threads: no thread ended in 30 runs of
MobileViT-XXS, DeiT-tiny, EfficientFormerV2), and a master thread that exits without letting its team go.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

import numpy as np

_Callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_PYGILSTATE_LOCKED = 0  # PyGILState_STATE of an Ensure made while this thread already held the GIL
_LOCAL = threading.local()  # `kept` on an OpenMP thread whose state stays between callbacks
# How long forget_team waits for a region of another thread (the event loop must not stall behind one)
FORGET_WAIT_S = 0.05


def chunk_indices(thread: int, threads: int, chunks: int) -> range:
    """The chunks OpenMP thread `thread` of `threads` runs: every threads-th from its own number."""
    return range(thread, chunks, threads)


class OpenMPPool:
    """The SpinPool interface (run, park, close) over libgomp's team; `lib` resolves libgomp's symbols (libdnnl,
    which links it)."""

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
        self._forget = _Callback(self._forget_state)
        self._master = threading.get_native_id()  # the thread whose team runs the current region
        self._job: tuple | None = None
        self._errors: list[BaseException] = []
        self.busy = threading.Lock()  # one region at a time; a concurrent caller runs its loop alone

    def _chunks(self, _data) -> None:
        if threading.get_native_id() != self._master and not getattr(_LOCAL, "kept", False):
            ctypes.pythonapi.PyGILState_Ensure()  # an OpenMP thread's first callback: its state stays (docstring)
            _LOCAL.kept = True
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
            self._job, self._master = (fn, args, bounds), threading.get_native_id()
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

    def forget_team(self) -> bool:
        """Before the calling thread's team is let go: its OpenMP threads give back the state they kept (one region
        over the whole team, each dropping its extra Ensure; the release around the callback then deletes the
        state). False, nothing done, when another thread's region holds the pool longer than FORGET_WAIT_S."""
        if not self.busy.acquire(timeout=FORGET_WAIT_S):
            return False
        try:
            self._master = threading.get_native_id()
            self._parallel(self._forget, None, self.threads, 0)
        finally:
            self.busy.release()
        return True

    def _forget_state(self, _data) -> None:
        if threading.get_native_id() != self._master and getattr(_LOCAL, "kept", False):
            _LOCAL.kept = False
            ctypes.pythonapi.PyGILState_Release(_PYGILSTATE_LOCKED)

    def close(self) -> None:
        """Nothing to stop: the threads are OpenMP's."""
