"""Our kernels' chunks on OpenMP's team (the `run` wait policy, threads.py): one pool for the whole engine.

oneDNN runs its primitives on libgomp's threads; with a pool of our own beside them, two sets of idle threads
wait for the next op, and spinning ones of both would take turns on the same cores. Here a parallel_for is a
libgomp parallel region (GOMP_PARALLEL, the entry point `#pragma omp parallel` compiles to) whose every thread
runs a ctypes callback: the chunks for its thread number. The team is the caller's own (the one its oneDNN
primitives use), so its threads' wait policy (GOMP_SPINCOUNT, set before libgomp loaded) is the engine's one policy.

A callback runs Python, so an OpenMP thread holds the GIL to dispatch its chunk (the numba kernel releases it);
each thread keeps the Python thread state its first callback made (one more PyGILState_Ensure), so later regions
do not create and destroy one each time. A team that is let go (threads.release_thread) first gives those states
back (`forget_team`): an OpenMP thread that exits holding one would leak it.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

import numpy as np

_Callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_PYGILSTATE_LOCKED = 0  # PyGILState_STATE of an Ensure made while this thread already held the GIL

# OpenMP threads that keep a Python thread state (native id -> the native id of the master whose team they are in),
# process-wide: a state belongs to an OS thread, whichever pool object's callback made it. Read and written with the
# GIL held.
_KEPT: dict[int, int] = {}


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
        self._job: tuple | None = None
        self._master = threading.get_native_id()  # the thread whose team runs the current region
        self._errors: list[BaseException] = []
        self.busy = threading.Lock()  # one region at a time; a concurrent caller runs its loop alone

    def _chunks(self, _data) -> None:
        me = threading.get_native_id()
        if me != self._master and me not in _KEPT:  # an OpenMP thread's first callback: its state stays (docstring)
            ctypes.pythonapi.PyGILState_Ensure()
            _KEPT[me] = self._master
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
            # ctypes lets the GIL go for the region
            self._parallel(self._callback, None, min(len(bounds), self.threads), 0)
            self._job = None
            if self._errors:
                error = self._errors[0]
                self._errors.clear()
                raise error
        finally:
            self.busy.release()
        return True

    def forget_team(self) -> None:
        """Before the calling thread's team is let go: its threads give back the Python thread state their first
        callback kept (one region over the team, each dropping its extra Ensure; the callback's own release then
        deletes the state). Without it each exiting thread would leak one."""
        master = threading.get_native_id()
        if master not in _KEPT.values():
            return  # only oneDNN ran on this team: no Python state to give back
        with self.busy:
            self._master = master
            self._parallel(self._forget, None, self.threads, 0)
        for thread in [t for t, m in _KEPT.items() if m == master]:  # one the region missed leaks, never crashes
            del _KEPT[thread]

    def _forget_state(self, _data) -> None:
        me = threading.get_native_id()
        if me != self._master and _KEPT.get(me) == self._master:
            del _KEPT[me]
            ctypes.pythonapi.PyGILState_Release(_PYGILSTATE_LOCKED)

    def close(self) -> None:
        """Nothing to stop: the threads are OpenMP's."""
