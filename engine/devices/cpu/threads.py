"""The engine's threads: one count for the kernel pool and OpenMP (oneDNN), BLAS kept to one thread, and one wait
policy for every pool we run: spin a while, then sleep.

Why our own pool and not numba's parallel=True: its OpenMP workers spin between calls and fight the BLAS and
oneDNN threads for the cores (on a busy 2-core machine a tiny parallel epilogue took 20 ms instead of 0.05 ms),
and every prange kernel costs seconds to compile. Plain nogil kernels on our threads compile fast, run serially
when the work is small, and the thread count is one knob (`set_threads`).

Two wait policies (NNSERVE_WAIT_POLICY, CpuOptions.wait_policy): `run`, the default, below; and `short`
(NNSERVE_SPIN_US, CpuOptions.spin_us): a worker that finished its chunk polls for the next one for
that long (a nogil loop on the CPU's spin-wait hint, loops/spin.py), then sleeps on a condition variable.
OpenMP's team (oneDNN's) gets the same bound through GOMP_SPINCOUNT on libgomp, counted in the same spin-wait polls
(`gomp_spincount`), or KMP_BLOCKTIME on Intel's runtime, set before it loads (onednn/binding.py); 0 sleeps at once
(OMP_WAIT_POLICY=PASSIVE). Our workers stop spinning when a oneDNN primitive starts (`park`), so they never compete
with OpenMP's team.

`short`'s bound is a couple of microseconds, on purpose: long enough for the partner of a balanced split to reach
the end-of-op barrier (the two halves of one op finish within microseconds of each other), shorter than the gaps
between ops (10-50 us of Python dispatch), so a thread sleeps between ops and is woken for the next one. A longer
spin loses in the two places a server lives (bench/wait_policy.py, bench/RESULTS.md "Wait policy"):
- on a shared or busy host a spinning thread burns the time slice of the thread it waits for (2 cores at load 2-5:
  GhostNet at batch 1 took 20-62 ms a call with a 200 us spin, 11-12 ms with 2-5 us; ResNet-18 35-42 vs 25-35);
- on a virtual machine (KVM here), after an idle pause the two threads of an instance fell into a regime where
  most hand-overs took hundreds of microseconds and stayed there while the calls ran back to back (UltraFace at
  batch 1: 1.7 ms a call, then ~10 ms after one or two 0.5 s pauses, with a 200 us spin; 2.2 ms steadily with
  2 us, and no such regime). The likely cause: a pause loop longer than the hypervisor's pause-loop window (KVM's
  default: 4096 cycles, ~1.5 us) traps to the host, which may run something else on that core meanwhile.
(That is why `short` sleeps between ops; `run` below spins across them and takes those risks instead.)

The `run` policy (the default since 2026-11-27; `short` was before): spin through a request, sleep when idle. With
oneDNN loaded our kernels' chunks run on OpenMP's team (openmp_pool.py: one pool, so no two sets of idle threads
share the cores). On Intel's OpenMP (the default where installed, onednn/binding.py) its threads spin up to
RUN_SPIN_CAP_US (20 ms, KMP_BLOCKTIME) after each op, which carries them across a request's serial stretches (Python
between ops, ops too small to split), so primitives split from SPINNING_FORK_WORK, 16x smaller than FORK_WORK; an
idle server's threads sleep 20 ms after its last op. On libgomp, whose spin is a count fixed when it loads, they
spin NNSERVE_RUN_SPIN_US (100 us: more than the Python dispatch between two ops) after each op, then sleep, and
after a one-thread stretch longer than that the next split op wakes a sleeping thread: hence FORK_WORK there.
Without oneDNN our workers spin while a run is in progress (`running`, entered by the CPU device around every run)
and NNSERVE_RUN_SPIN_US after it, RUN_SPIN_CAP_US at most.
Why it became the default (bench/RESULTS.md, Wait policy, 2026-11-27 02:56, a quiet AMD EPYC VM, 2 vCPUs): back to
back, the traffic the speed targets are measured in, `run` took 0.75-0.91x of `short`'s time on DeiT-tiny,
EfficientFormerV2, GhostNet and ResNet-18 (MobileViT-XXS 1.00x), as on 2026-11-26 (0.61-0.92x on seven models), and
0.77-0.87x on the CNN five (04:00). Beside busy loops and on bursts after an idle pause the two are mixed: DeiT-tiny
0.67-0.75x, ResNet-18 0.89-0.99x, EfficientFormerV2 0.96x busy and 1.14x on bursts, MobileViT-XXS 1.11x and 1.14x,
GhostNet 1.94x and 1.17x. A host shared with other busy work may prefer `short`.

Small kernels never fork at all (`threads_for`: a oneDNN primitive of
little work is created for one thread), so they pay no hand-over either way.

What the second thread costs and why a run cannot simply drop to one thread (measured 2026-11-26, 2 vCPUs, KVM):
- the wake-up is most of what a split saves on mid-sized ops: oneDNN's matmul of DeiT-tiny's fc1 (197x192x768,
  29M multiply-adds) took 0.35 ms on one thread, 0.30 ms on two whose team sleeps between calls, 0.19-0.26 ms on
  two whose team spins (GOMP_SPINCOUNT 2500);
- beside other runnable work (another job, even at nice 19) every hand-over waits for the partner to get a core
  back: the calling thread of EfficientFormerV2 waited 3-7 ms of a 12-20 ms call runnable for a CPU (schedstat;
  0.1 ms on a quiet host), and one thread was then the fastest setting (bench/wait_policy.py shows the wait);
- a oneDNN primitive runs on exactly the team it was created for: its jit convolutions fork that count whatever
  omp_set_num_threads says (seen in a debugger), and a team of one forced on a primitive
  (omp_set_max_active_levels(0)) is wrong, not slower: the brgemm matmul splits its work by the count it was
  created for, and the fc1 above left 75648 of its 151296 outputs unwritten. Running a busy host's requests on
  one thread would need a second, one-thread primitive per op, made at load.

The count is process-wide (the pool is). Its default is the CPUs the process may really use: NNSERVE_NUM_THREADS
(CpuOptions.threads) when given, else the affinity mask capped by the cgroup CPU quota, v2 or v1 (a container
limited to 2 CPUs on a 64-core node must not start 64 threads), and by DEFAULT_MAX_THREADS (more measured slower);
the first instance applies it (`configure`). BLAS libraries get one thread (threadpoolctl): blas.py splits large
GEMMs over this pool instead, so no library thread busy-waits beside it.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from engine.devices.cpu.busy_host import SpinGuard
from engine.devices.cpu.colocation import IdleWatch, spread_team, team_tids
from engine.devices.cpu.loops.spin import spin_until_done, spin_while_equal, spin_while_running
from engine.devices.cpu.openmp_pool import OpenMPPool
from engine.devices.cpu.options import RUN_SPIN_CAP_US, WaitPolicy

log = logging.getLogger("engine.devices.cpu")

# Below this much work (elements x taps) a kernel runs on the calling thread: handing a chunk over costs ~5-50 us.
MIN_WORK = 1 << 18
# Below this many multiply-adds a oneDNN primitive runs on one thread (`threads_for`): ~80-150 us of work. With the
# short spin a fork wakes a sleeping OpenMP thread (20-50 us on a VM) and waits for it at the end; measured on
# whole models at batch 1 (quiet, 2 cores, against 1 << 20): GhostNet 0.88x, MobileViT-XXS 0.93x,
# EfficientFormerV2 0.98x, ResNet-18 1.00x (its convs are far above this); int8 convs use the same bound. The same
# under the `run` policy: a quarter of these bounds measured 3x slower on GhostNet at batch 1 on a loaded host.
FORK_WORK = 1 << 22
# A primitive that reads more bytes than it does multiply-adds (a matrix-vector product: a batch-1 classifier head,
# a 1x1 conv on a 1x1 map; every weight read once) is bound by one core's memory bandwidth, not its arithmetic: its
# time is that of about this many multiply-adds per byte read (one core: 45 GMAC/s of float32 FMAs against 15-20 GB/s
# from L3 or memory on an AVX-512 EPYC; 20-25 GMAC/s against 10-15 GB/s on an AVX2 one), so `work_of` counts it so.
MACS_PER_BYTE = 2
# The `run` policy: a worker spins while a run is in progress, at most RUN_SPIN_CAP_US in one wait (options.py);
# then the grace after the run, then it sleeps.
# FORK_WORK when OpenMP's threads spin through a request (Intel's OpenMP under `run`: use_openmp): no split waits
# for a sleeping thread then, and a split of ~10 us of work already gains. Against libgomp with FORK_WORK, one
# process per setting, 2 rounds, a 2-vCPU AMD EPYC VM (bench/RESULTS.md "Wait policy", 2026-11-28 00:16): back to
# back GhostNet 0.81x, MobileViT-XXS 0.89x, ResNet-18 0.95x, DeiT-tiny 1.02x, EfficientFormerV2 1.10x (0.87x in the
# run before); bursts after an idle pause 0.74-0.91x; beside two busy loops 1.06-1.60x (busy_host.py stops the
# spinning there, but a primitive keeps the threads it was created for, so each small split wakes a thread).
SPINNING_FORK_WORK = 1 << 18
# The default count's ceiling (NNSERVE_NUM_THREADS goes past it). On a 16-core Intel Xeon VM (AVX-512 and AMX,
# 2026-11-27, the lent GPU machine's CPUs; bench/RESULTS.md, "Many cores") our splits stopped paying at 8 threads
# and past them fell off a cliff: MobileViT-XXS at batch 1 16.4 ms at 8 threads, 18.5 at 6, 17.9 at 4, 43 at 12,
# 19-42 at 16 (in-process A/B 13.2 at 8 against 18.6 at 16), its attention 5.4 ms at 8 and 15-27 at 12-16;
# UltraFace 2.69 ms at 8, 2.76 at 16. ONNX Runtime on that machine was also fastest at 8 (8.2 ms against 8.8 at 16).
DEFAULT_MAX_THREADS = 8
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller: cpu.cfs_quota_us, cpu.cfs_period_us
OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: the threads go, the settings stay
_PAD = 8  # int64 words per worker: each worker's flags on a cache line of their own


def cgroup_cpus(path: Path = CGROUP_CPU_MAX, v1: Path = CGROUP_V1_CPU) -> int | None:
    """CPUs allowed by the cgroup quota, rounded up: cgroup v2's cpu.max ("quota period", "max period" =
    unlimited), else (no readable cpu.max: a cgroup v1 node, where Kubernetes CPU limits also live)
    cfs_quota_us / cfs_period_us (-1 = unlimited); None when unlimited or not found."""
    try:
        quota, period = path.read_text().split()[:2]
        return None if quota == "max" else _quota_cpus(int(quota), int(period))
    except (OSError, ValueError):
        pass
    try:
        return _quota_cpus(int((v1 / "cpu.cfs_quota_us").read_text()), int((v1 / "cpu.cfs_period_us").read_text()))
    except (OSError, ValueError):
        return None


def _quota_cpus(quota: int, period: int) -> int | None:
    return None if quota <= 0 or period <= 0 else max(1, math.ceil(quota / period))


def available_cpus() -> int:
    """The CPUs this process may run on: its affinity mask, capped by the cgroup quota."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpus()
    return max(1, min(cpus, quota) if quota else cpus)


def default_threads(setting: int | None = None) -> int:
    """The thread count for a setting (NNSERVE_NUM_THREADS, a positive int or None): the setting, else the CPUs
    this process may use, at most DEFAULT_MAX_THREADS."""
    return setting if setting else min(available_cpus(), DEFAULT_MAX_THREADS)


@functools.cache
def poll_ns() -> float:
    """Nanoseconds one spin-wait poll takes here (the hint's latency: ~15 ns on recent Intel cores, more on older
    ones); the least of a few timed runs, so a preemption does not inflate it."""
    word = np.zeros(_PAD, np.int64)
    spin_while_equal(word, 0, word[1:], 1)  # compiled (or loaded from numba's cache) before timing
    best = math.inf
    for _ in range(5):
        t = time.perf_counter_ns()
        spin_while_equal(word, 0, word[1:], 20_000)  # the word never changes: all 20000 polls
        best = min(best, (time.perf_counter_ns() - t) / 20_000)
    return max(best, 0.5)


def spin_polls(spin_us: int) -> int:
    """How many polls last `spin_us` microseconds."""
    return 0 if spin_us <= 0 else max(1, int(spin_us * 1000 / poll_ns()))


def gomp_spincount(spin_us: int) -> int:
    """GOMP_SPINCOUNT for the same bound: libgomp counts the same polls (a relaxed load and the spin-wait hint)."""
    return spin_polls(spin_us)


class SpinPool:
    """`workers` threads, each with its own go/done words: parallel_for sets a worker's task and bumps its go word;
    the worker, spinning or woken from sleep, runs it and copies go into done. The caller runs the first chunk
    itself, then spins (and at worst sleeps) until every helper it used is done."""

    def __init__(self, workers: int, spin_us: int, through_runs: bool = False):
        self.workers = workers
        self.polls = spin_polls(spin_us)
        # `run` policy: spin while a run is in progress (ACTIVE), then `polls` more, `cap` at most
        self.through_runs = through_runs
        self.cap = max(self.polls, spin_polls(RUN_SPIN_CAP_US))
        self.go = np.zeros(workers * _PAD, np.int64)
        self.done = np.zeros(workers * _PAD, np.int64)
        self.park = np.zeros(_PAD, np.int64)  # set while oneDNN runs: spinning workers go to sleep
        self.tasks: list[tuple | None] = [None] * workers
        self.errors: list[BaseException | None] = [None] * workers
        self.wake = [threading.Condition() for _ in range(workers)]
        self.asleep = [False] * workers
        self.finished = threading.Condition()
        self.waiting = False
        self.stopped = False
        self.busy = threading.Lock()  # one parallel_for at a time; a concurrent caller runs its loop alone
        self.threads = [threading.Thread(target=self._work, args=(w,), name=f"nnserve-kernel-{w}", daemon=True)
                        for w in range(workers)]
        for t in self.threads:
            t.start()

    # Every flag below is read and written by Python code holding the GIL, so a store before a load in one thread
    # is seen by the load after it in another (the GIL hand-over orders them): no wake-up is lost.
    def _work(self, w: int) -> None:
        slot, seen = w * _PAD, 0
        go = self.go[slot:slot + 1]
        while True:
            if not self._spin(go, seen):
                with self.wake[w]:
                    self.asleep[w] = True  # before reading go: the caller bumps go, then reads asleep
                    while go[0] == seen and not self.stopped:
                        self.wake[w].wait()
                    self.asleep[w] = False
            if self.stopped:
                return
            seen = int(go[0])
            task = self.tasks[w]
            try:
                if task is not None:
                    task[0](*task[1])
            except BaseException as e:  # handed to the caller, which raises it
                self.errors[w] = e
            self.done[slot] = seen
            if self.waiting:
                with self.finished:
                    self.finished.notify()

    def _spin(self, go: np.ndarray, seen: int) -> bool:
        if self.through_runs:
            return spin_while_running(go, seen, self.park, ACTIVE, self.polls, self.cap)
        return spin_while_equal(go, seen, self.park, self.polls)

    def run(self, fn: Callable[..., None], args: tuple, bounds: list[tuple[int, int]]) -> bool:
        """fn(*args, lo, hi) for every (lo, hi) in bounds, the first on this thread; False (nothing run) when
        another thread is using the pool."""
        if not self.busy.acquire(blocking=False):
            return False
        try:
            self.park[0] = 0
            helpers = min(len(bounds) - 1, self.workers)
            for w in range(helpers):
                self.tasks[w] = (fn, (*args, *bounds[w + 1]))
                self.go[w * _PAD] += 1
                if self.asleep[w]:
                    with self.wake[w]:
                        self.wake[w].notify()
            try:
                for lo, hi in bounds[0:1] + bounds[helpers + 1:]:
                    fn(*args, lo, hi)
            finally:
                self._wait(helpers)
                # taken and cleared even when this thread's own chunk raised: a helper's error left behind would
                # be raised by the next, valid call (of any model: the pool is the process's)
                errors = [e for e in self.errors[:helpers] if e is not None]
                self.errors[:helpers] = [None] * helpers
            if errors:
                raise errors[0]
        finally:
            self.busy.release()
        return True

    def _wait(self, helpers: int) -> None:
        # the bound, not the cap: on a busy host the helper may have lost its core, and a caller spinning on would
        # keep it from getting one back
        if spin_until_done(self.done, self.go, _PAD, helpers, self.polls + 1):
            return
        with self.finished:
            self.waiting = True
            try:
                while not all(self.done[w * _PAD] == self.go[w * _PAD] for w in range(helpers)):
                    self.finished.wait()
            finally:
                self.waiting = False

    def close(self) -> None:
        self.stopped = True
        for w in range(self.workers):
            with self.wake[w]:
                self.wake[w].notify()


_threads = default_threads()  # until the first instance applies its setting (configure) or set_threads is called
_policy = WaitPolicy()
_spin_us = _policy.openmp_spin_us  # what our pool's workers poll: the policy's bound, as OpenMP's threads
_configured = False
_spin_configured = False
_blas_threads: int | None = None
_pool: SpinPool | OpenMPPool | None = None
_pause_warned = False
_openmp: ctypes.CDLL | None = None  # OpenMP's symbols (onednn/binding.OMP) once oneDNN is loaded: see use_openmp
_fork_work = FORK_WORK  # threads_for's bound: SPINNING_FORK_WORK once OpenMP's threads spin through a request
_guard: SpinGuard | None = None  # Intel's OpenMP under `run`: spinning only while the host is calm (busy_host.py)
_intel = False  # whether OpenMP is Intel's runtime
# Runs in progress (word 0), read without the GIL by spinning workers under the `run` policy.
ACTIVE = np.zeros(_PAD, np.int64)
_active_lock = threading.Lock()


def set_blas_threads(n: int) -> None:
    """Sets the BLAS libraries' thread count (threadpoolctl)."""
    global _blas_threads
    if _blas_threads == n:
        return
    threadpool_limits(limits=n, user_api="blas")  # applies now and stays (the object only restores on exit)
    _blas_threads = n


def _drop_pool() -> None:
    global _pool
    if _pool is not None:
        _pool.close()
        _pool = None


def set_threads(n: int) -> None:
    """How many threads (the caller included) a large kernel or GEMM is split over."""
    global _threads, _configured
    n = max(1, int(n))
    _configured = True
    set_blas_threads(1)
    if n == _threads:
        return
    _threads = n
    _drop_pool()


def set_spin(spin_us: int) -> None:
    """How long (microseconds) idle pool workers poll for work before sleeping; 0 sleeps at once."""
    global _spin_us, _spin_configured
    spin_us = max(0, int(spin_us))
    _spin_configured = True
    if spin_us != _spin_us:
        _spin_us = spin_us
        _drop_pool()


def get_threads() -> int:
    return _threads


def work_of(macs: int, bytes_read: int) -> int:
    """The work `threads_for` weighs for a primitive of `macs` multiply-adds that streams `bytes_read` bytes of
    operands it uses once (its weights): the larger of the two, in multiply-adds (MACS_PER_BYTE). A second thread
    halves a streaming read too: GhostNet's 1280x960 head and 1000x1280 classifier at batch 1, 5 MB of weights each
    and 1.2M multiply-adds, ran on one thread by their multiply-adds alone."""
    return max(int(macs), MACS_PER_BYTE * int(bytes_read))


def threads_for(work: int | None) -> int:
    """The threads a oneDNN primitive of `work` (multiply-adds, or elements x taps; `work_of` for one that streams
    its weights) may use: one below FORK_WORK, where the fork-join would cost more than the split saves (and, on a
    busy host, waits for a descheduled thread); the count otherwise, or when the work is not known (None)."""
    if work is not None and work < _fork_work:
        return 1
    return _threads


def park() -> None:
    """A oneDNN primitive is about to run on OpenMP's threads: our spinning workers go to sleep."""
    if _pool is not None:
        _pool.park[0] = 1


def get_spin() -> int:
    return _spin_us


def get_policy() -> WaitPolicy:
    return _policy


def _set_policy(policy: WaitPolicy) -> None:
    global _policy
    if policy != _policy:
        _policy = policy
        _drop_pool()  # the next parallel_for makes the policy's pool
    set_spin(policy.spin_us if policy.mode == "short" else policy.run_spin_us)


def configure(setting: int | None, policy: WaitPolicy | None = None) -> None:
    """Called when an instance is built: the first one gives the pool its default count (`setting`, else the
    CPUs) and the wait policy (CpuOptions.wait_policy); every one limits BLAS to one thread, the pool doing the
    splitting."""
    if not _configured:
        set_threads(default_threads(setting))
    if not _spin_configured:
        _set_policy(policy or WaitPolicy())
    set_blas_threads(1)


def use_openmp(lib: ctypes.CDLL, intel: bool = False, blocktime_ms: int | None = None,
               policy: WaitPolicy | None = None, move_apart: bool = True) -> None:
    """oneDNN is loaded (`lib` resolves OpenMP's calls; `intel`: Intel's runtime; `blocktime_ms`: the blocktime the
    engine gave it, None when the user set OpenMP's wait policy: onednn/binding.py; `policy`: the device's): under
    the `run` policy our kernels run on OpenMP's team from now on (openmp_pool.py), primitives split from
    `fork_work`, and where Intel's threads spin through requests, they do only while the host is calm
    (busy_host.py), whose guard moves a team's threads that share a CPU apart (colocation.py) unless `move_apart`
    is false (the user binds OpenMP's threads: CpuOptions.openmp_bound)."""
    global _openmp, _fork_work, _guard, _intel
    if _openmp is None:
        policy = policy or _policy
        _openmp, _intel = lib, intel
        _fork_work = fork_work(policy, blocktime_ms)
        if spins_through_requests(policy, blocktime_ms):
            team_tids()  # compiled (or loaded) now: a busy run is no time for it
            watch = IdleWatch()
            spread = (lambda: _spread_team(watch)) if move_apart else None
            _guard = SpinGuard(lib.kmp_set_blocktime, lib.kmp_get_blocktime, spread=spread)
        if policy.one_pool:  # the next parallel_for makes the OpenMP one
            _drop_pool()


def _spread_team(idle: IdleWatch) -> bool:
    """colocation.spread_team for the calling thread's team, of the size the pool's regions run."""
    pool = _get_pool()
    return isinstance(pool, OpenMPPool) and spread_team(run_native, region_job, pool.threads, idle,
                                                        set(os.sched_getaffinity(0)))


def fork_work(policy: WaitPolicy, blocktime_ms: int | None) -> int:
    """threads_for's bound: SPINNING_FORK_WORK when OpenMP's threads spin through a request (Intel's runtime under
    `run`, with a blocktime of the engine's), else FORK_WORK."""
    return SPINNING_FORK_WORK if spins_through_requests(policy, blocktime_ms) else FORK_WORK


def spins_through_requests(policy: WaitPolicy, blocktime_ms: int | None) -> bool:
    """Whether OpenMP's threads spin through a request: Intel's runtime (a blocktime) of the engine's, under `run`."""
    return policy.mode == "run" and blocktime_ms is not None and blocktime_ms > 0


def pool_kind(policy: WaitPolicy, openmp: bool) -> str:
    """Which pool runs our kernels: OpenMP's team under the `run` policy once OpenMP is loaded, else ours."""
    return "openmp" if policy.one_pool and openmp else "spin"


class _Running:
    """`running`'s context: a class where a generator-based context manager cost a run ~2.5 us more."""

    __slots__ = ("guard", "started")

    def __enter__(self) -> _Running:
        self.guard = guard = _guard
        self.started = guard.begin() if guard is not None else None
        with _active_lock:
            ACTIVE[0] += 1
        return self

    def __exit__(self, kind, value, traceback) -> None:
        try:
            if kind is None and self.guard is not None:  # a run that failed (a refused request) says nothing
                self.guard.end(self.started)
        finally:
            with _active_lock:
                ACTIVE[0] -= 1


def running() -> _Running:
    """Around a run: while any is in progress, the `run` policy's workers keep spinning between ops (on Intel's
    OpenMP, while the host is calm: busy_host.py)."""
    return _Running()


def release_thread() -> bool:
    """Lets the calling thread's OpenMP team go (oneDNN's threads; ours too under the `run` policy): its threads
    exit, and the next primitive this thread runs makes a new team (0.4-1 ms). False only when it should be tried
    again later: called inside a parallel region, where libgomp refuses. Without oneDNN there is no team; with a
    libgomp older than OpenMP 5.0's pause the team stays (said once in the log).

    Why: each thread that runs a parallel region keeps a team of its own, and libgomp counts every team's threads,
    idle or not; once they outnumber the CPUs it cuts every team's spin to 100 polls (2-3 us, `do_spin`'s throttled
    count), so each thread sleeps between ops and every op after it waits for a wake-up. A thread that has finished
    with kernels for a while (a server's loader after the warm-up, an idle worker) calls this so the threads that do
    run keep the wait policy's spin: MobileNetV2 int8 at batch 1, 2 vCPUs, built and warmed up on one thread and run
    on another, 14.6 ms a run with the loader's team kept, 11.9 ms with it let go (bench/thread_release.py;
    bench/RESULTS.md, "Wait policy", 2026-11-27 17:07). Our OpenMP threads hold no Python state between regions
    (openmp_pool.py), so nothing is left behind when they exit. On Intel's OpenMP the pause is process-wide and the
    threads do not exit: they sleep in its pool, from which the next team takes them (a run on another thread then
    wakes its team's threads once; tests/engine/runtime/test_threads.py)."""
    global _pause_warned
    if _openmp is None:
        return True  # no OpenMP loaded: no team
    if _openmp.omp_in_parallel():
        return False
    pause = getattr(_openmp, "omp_pause_resource_all", None)
    if pause is None:
        if not _pause_warned:
            _pause_warned = True
            log.warning("this libgomp has no omp_pause_resource_all (OpenMP 5.0): idle threads' OpenMP teams stay, "
                        "and with more of them than CPUs libgomp shortens every team's spin")
        return True
    paused = pause(OMP_PAUSE_SOFT) == 0  # -1: inside a region of one thread (omp_in_parallel only sees others)
    # Intel's runtime answers nonzero when it is paused already (another thread's release, process-wide there); not
    # inside a region, checked above
    return paused or _intel


def _get_pool() -> SpinPool | OpenMPPool:
    global _pool
    if _pool is None:
        if pool_kind(_policy, _openmp is not None) == "openmp":
            _pool = OpenMPPool(_openmp, _threads)
        else:
            _pool = SpinPool(max(1, _threads - 1), _spin_us, through_runs=_policy.mode == "run")
    return _pool


def _after_fork() -> None:
    global _pool
    ACTIVE[0] = 0  # the child runs nothing yet
    if _guard is not None:
        _guard.after_fork()
    _pool = None  # the child has none of the parent's threads; it starts its own pool when it needs one


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def chunks_for(n_items: int, work: int) -> int:
    """How many chunks parallel_for splits [0, n_items) into for `work`: one below MIN_WORK."""
    return min(_threads, n_items) if work >= MIN_WORK else 1


def native_regions() -> bool:
    """Whether our kernels' splits run on OpenMP's team and its threads spin through a request (Intel's runtime
    under `run`, the host calm: busy_host.py): a native region (`run_native`) then starts on every thread at once."""
    # the guard exists exactly where the threads spin through requests (use_openmp)
    return pool_kind(_policy, _openmp is not None) == "openmp" and _guard is not None and _guard.target() != 0


def openmp_thread_functions() -> tuple[int, int]:
    """The addresses of omp_get_thread_num and omp_get_num_threads in the runtime our kernels' regions run on
    (remembered per runtime: a split pass asks on every run)."""
    global _thread_functions
    if _openmp is None:
        raise RuntimeError("no OpenMP runtime is in use")
    if _thread_functions is None or _thread_functions[0] is not _openmp:
        _thread_functions = (_openmp, tuple(ctypes.cast(getattr(_openmp, f), ctypes.c_void_p).value
                                            for f in ("omp_get_thread_num", "omp_get_num_threads")))
    return _thread_functions[1]


_thread_functions: tuple | None = None  # (runtime, its two addresses): openmp_thread_functions


def region_job(length: int) -> np.ndarray:
    """A native region's job: `length` int64 words, zero but for words 0 and 1, the addresses of omp_get_thread_num
    and omp_get_num_threads that every region reads its position through (loops/native.open_job)."""
    job = np.zeros(length, np.int64)
    job[0], job[1] = openmp_thread_functions()
    return job


def run_native(fn: int, job: np.ndarray) -> bool:
    """The native region function at address `fn` on OpenMP's team (OpenMPPool.run_native) over `job` (its words);
    False, nothing run, when our kernels do not run on OpenMP's team (the `short` policy, no oneDNN) or another thread
    holds it: the caller then runs its work another way. The job array itself, not its address: held here through
    the region (an address taken from a temporary job let the array go before the region read it, its memory free
    for another thread's next job)."""
    pool = _get_pool()
    return isinstance(pool, OpenMPPool) and pool.run_native(fn, job.ctypes.data)


class LastJob:
    """A kernel's last region job, kept for the same input and output array objects (a binding's arena views are,
    run after run): a small kernel's job costs as much as its work. One tuple, read once: a kernel shared by
    instances on two threads reads its own arrays' job or makes one. It holds the last arrays until the next run."""

    __slots__ = ("_last",)

    def __init__(self):
        self._last: tuple | None = None

    def get(self, x: np.ndarray | list | tuple, out: np.ndarray, make: Callable[[], np.ndarray],
            keep: bool = True) -> np.ndarray:
        """The job for x (an array, or a kernel's several inputs) and out: the last one made for these very
        objects, else `make()` (kept where `keep`; several inputs as a tuple of their own, which a list the caller
        changes in place later does not change)."""
        hit = self._last
        if hit is not None and hit[1] is out and _same_objects(hit[0], x):
            return hit[2]
        job = make()
        if keep:
            self._last = (tuple(x) if isinstance(x, (list, tuple)) else x, out, job)
        return job


def _same_objects(kept, x) -> bool:
    """Whether `x` is the object LastJob kept, or a list or tuple of the very objects it kept a tuple of."""
    if kept is x:
        return True
    return (isinstance(kept, tuple) and isinstance(x, (list, tuple)) and len(kept) == len(x)
            and all(a is b for a, b in zip(kept, x, strict=True)))


def regions_callable() -> bool:
    """Whether region functions can be called at all (run_alone, run_native): their jobs name the functions of the
    OpenMP runtime oneDNN loads, so without oneDNN (NNSERVE_ONEDNN=0, or not installed) there is none to name."""
    return _openmp is not None


@functools.cache
def _c_function(fn: int) -> ctypes._CFuncPtr:
    return ctypes.CFUNCTYPE(None, ctypes.c_void_p)(fn)


def run_alone(fn: int, job: np.ndarray) -> None:
    """The native region function at address `fn` over `job` on this thread alone (outside any region: every item),
    as a native program's OP_CALL record runs it. For loops whose machine code may differ between their cfunc and
    their numba dispatcher (reductions that fast-math lets LLVM reassociate, vectorised per compilation), a kernel
    whose records call the cfunc calls it from Python too, so that a replay gives its Python path's bits."""
    _c_function(fn)(job.ctypes.data)


def region_record(fn: int, data: int) -> tuple[int, ...] | None:
    """run_native(fn, data) as a native_program record (GOMP_parallel over the pool's team), for a caller that
    holds `region_pool().busy` while it runs; None when our kernels do not run on OpenMP's team."""
    pool = _get_pool()
    return pool.region_record(fn, data) if isinstance(pool, OpenMPPool) else None


def region_pool() -> OpenMPPool | None:
    """The OpenMP pool our native regions run on, None when there is none."""
    pool = _get_pool()
    return pool if isinstance(pool, OpenMPPool) else None


def regime() -> tuple:
    """What the choices of thread counts and of native regions depend on (a recorded program holds those
    choices: fused_calls.py): the count, the fork bound, whether native regions run (which needs OpenMP's pool)."""
    return _threads, _fork_work, native_regions()


def parallel_for(fn: Callable[..., None], n_items: int, work: int, *args) -> None:
    """Runs fn(*args, lo, hi) over [0, n_items), in up to get_threads() chunks when `work` is large."""
    k = chunks_for(n_items, work)
    if k <= 1:
        fn(*args, 0, n_items)
        return
    bounds = [(i * n_items // k, (i + 1) * n_items // k) for i in range(k)]
    if not _get_pool().run(fn, args, bounds):
        fn(*args, 0, n_items)  # another thread holds the pool: this caller's cores are busy anyway
