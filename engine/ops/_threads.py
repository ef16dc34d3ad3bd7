"""Splits a nogil numba kernel over ranges of an item axis (channels, N*C) on a small shared thread pool.

Why not numba's parallel=True: its OpenMP workers spin between calls and fight OpenBLAS's own threads for the
cores (on a busy 2-core machine a tiny parallel epilogue took 20 ms instead of 0.05 ms), and every prange
kernel costs seconds to compile. Plain nogil kernels on Python threads compile fast, run serially when the
work is small, and the thread count is one knob (`set_threads`) for the performance work.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

# Below this much work (elements x taps) a kernel runs on the calling thread: a pool hop costs ~20-50 us.
MIN_WORK = 1 << 18
_threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
_pool: ThreadPoolExecutor | None = None


def set_threads(n: int) -> None:
    """How many threads (the caller included) a large kernel is split over."""
    global _threads, _pool
    _threads = max(1, int(n))
    if _pool is not None:
        _pool.shutdown(wait=False)
        _pool = None


def get_threads() -> int:
    return _threads


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=max(1, _threads - 1), thread_name_prefix="nnserve-kernel")
    return _pool


def parallel_for(fn: Callable[..., None], n_items: int, work: int, *args) -> None:
    """Runs fn(*args, lo, hi) over [0, n_items), in up to get_threads() chunks when `work` is large."""
    k = min(_threads, n_items) if work >= MIN_WORK else 1
    if k <= 1:
        fn(*args, 0, n_items)
        return
    bounds = [(i * n_items // k, (i + 1) * n_items // k) for i in range(k)]
    pool = _get_pool()
    futures = [pool.submit(fn, *args, lo, hi) for lo, hi in bounds[1:]]
    fn(*args, *bounds[0])
    for f in futures:
        f.result()
