"""The engine's thread count: one knob for BLAS and for the nogil numba kernels split over a small pool.

Why not numba's parallel=True: its OpenMP workers spin between calls and fight OpenBLAS's own threads for the
cores (on a busy 2-core machine a tiny parallel epilogue took 20 ms instead of 0.05 ms), and every prange
kernel costs seconds to compile. Plain nogil kernels on Python threads compile fast, run serially when the
work is small, and the thread count is one knob (`set_threads`) for the performance work.

The count is process-wide (the pool is). Its default is the CPUs the process may really use: the
NNSERVE_NUM_THREADS setting (CpuOptions.threads) when given, else the affinity mask capped by the cgroup CPU
quota (a container limited to 2 CPUs on a 64-core node must not start 64 BLAS threads); the first instance
applies it (`configure`). BLAS libraries get one thread (threadpoolctl): blas.py splits large GEMMs over this
pool instead, so the engine never runs more threads than the count and no library thread busy-waits beside it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from threadpoolctl import threadpool_limits

# Below this much work (elements x taps) a kernel runs on the calling thread: a pool hop costs ~20-50 us.
MIN_WORK = 1 << 18
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def cgroup_cpus(path: Path = CGROUP_CPU_MAX) -> int | None:
    """CPUs allowed by a cgroup v2 quota ("quota period", "max period" = unlimited), None when unlimited."""
    try:
        quota, period = path.read_text().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        return None


def available_cpus() -> int:
    """The CPUs this process may run on: its affinity mask, capped by the cgroup quota."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpus()
    return max(1, min(cpus, quota) if quota else cpus)


def default_threads(setting: int | None = None) -> int:
    """The thread count for a setting (NNSERVE_NUM_THREADS, a positive int or None)."""
    return setting if setting else available_cpus()


_threads = available_cpus()  # until the first instance applies its setting (configure) or set_threads is called
_configured = False
_blas_threads: int | None = None
_pool: ThreadPoolExecutor | None = None


def set_blas_threads(n: int) -> None:
    """Sets the BLAS libraries' thread count (threadpoolctl)."""
    global _blas_threads
    if _blas_threads == n:
        return
    threadpool_limits(limits=n, user_api="blas")  # applies now and stays (the object only restores on exit)
    _blas_threads = n


def set_threads(n: int) -> None:
    """How many threads (the caller included) a large kernel or GEMM is split over."""
    global _threads, _pool, _configured
    n = max(1, int(n))
    _configured = True
    set_blas_threads(1)
    if n == _threads:
        return
    _threads = n
    if _pool is not None:
        _pool.shutdown(wait=False)
        _pool = None


def get_threads() -> int:
    return _threads


def configure(setting: int | None) -> None:
    """Called when an instance is built: the first one gives the pool its default count (`setting`, else the
    CPUs); every one limits BLAS to one thread, the pool doing the splitting."""
    if not _configured:
        set_threads(default_threads(setting))
    set_blas_threads(1)


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
