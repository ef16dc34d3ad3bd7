"""When an instance's OpenMP threads share one CPU while another allowed CPU sits idle: move the workers apart.

Seen on a 2-vCPU VM (bench/RESULTS.md, Int8, 2026-11-28 18:56): under bursts of calls after idle pauses the
scheduler woke the worker on its waker's CPU and both threads ran on one vCPU, the other idle, every fork and join a
preemption (~80 involuntary switches a call, 9-11 ms against 5.2-5.8 for UltraFace int8 at batch 8); `taskset -c 0`
with two threads gives the same signature. The busy-host guard (busy_host.py) took those switches for a busy host
and turned spinning off, and with the threads then sleeping after every op the scheduler kept them together: the
state never ended. So before a run counts as busy, the guard asks `spread_team` whether the host had room for it.
Where the affinity mask is the whole host, the answer is its run queue just after the run (/proc/stat's
procs_running, the team's own threads included): no more runnable threads than CPUs. Then the run's switches were
the team's own, and each worker that shares a CPU with another of the team is pinned to an allowed CPU free of the
team (sched_setaffinity). Whether the team shares a CPU when the run has ended is no test of that: on the same VM
(Int8 bench, 2026-11-29) a third of the bursts' runs showed 20-110 switches, in some the threads were apart again by
the end, and a worker pinned away was followed by the master, woken on its waker's CPU at the next join. Other work
that keeps the host busy shows in the queue: two busy loops beside a team of two on 2 CPUs are three or four
runnable threads (four while the team spins). The count is of one instant and misses the team's sleeping workers:
one busy loop beside a team that sleeps reads as room, the threads spin again after CALM_RUNS such runs, and the
next spinning run shows busy (on 2 vCPUs beside one loop, no slower than sleeping throughout). Where the mask is
narrower than the host (a cpuset), the host's queue says nothing of the mask's CPUs, and a busy-looking run is the
team's own only when two of its threads shared a CPU and one could be moved to an idle one. The pin stays while
the runs are calm, and the master (the caller's thread) is never pinned; a busy-looking run hands every pin older than
PIN_HOLD_S back the mask it had first (the CPU it holds may have turned busy since), then pins again where the team
shares a CPU. All of this (the verdict too) only on small hosts
(MAX_ALLOWED_CPUS), never where the user binds OpenMP's threads, and pins only onto a CPU that was idle most of the last
window (IdleWatch, from /proc/stat): a worker pinned to a CPU another process keeps busy could not leave it, and the
master would wait for it at every join and at its team's release. Where something is mounted over /proc/stat (a
container's LXCFS: its per-CPU lines come from the container's own usage, renumbered from 0) or it does not list
every CPU of the affinity mask by its number, its idle shares say nothing of the mask's CPUs: nothing is pinned
then, and on LXCFS no run is counted the team's own.

The team's thread ids come from a native region in which each thread calls gettid (glibc 2.30 and later; without it
nothing is moved), their CPUs from /proc/self/task/<tid>/stat (field 39: the CPU each last ran on).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
import time
from collections.abc import Callable

import numpy as np
from numba import carray

from engine.devices.cpu.loops.native import call_int, i64_at, open_job, region

log = logging.getLogger("engine.devices.cpu")

# `job` (int64 words) of `team_tids`: the addresses of omp_get_thread_num and omp_get_num_threads, of gettid, of
# the int64 output (one tid per thread) and its length.
TID_THREAD_NUM, TID_NUM_THREADS, TID_GETTID, TID_OUT, TID_CAP, TID_LEN = range(6)


@region
def team_tids(data):
    """Each thread of the team writes its kernel thread id at its number (below the output's length)."""
    job, t, team = open_job(data, TID_LEN)
    if t < job[TID_CAP]:
        carray(i64_at(job[TID_OUT]), (job[TID_CAP],))[t] = call_int(job[TID_GETTID])


@functools.cache
def gettid_address() -> int | None:
    """libc's gettid, None where this libc has none."""
    try:
        return ctypes.cast(ctypes.CDLL(None).gettid, ctypes.c_void_p).value
    except (AttributeError, OSError):
        return None


def spread_plan(cpus: list[int], allowed: set[int]) -> dict[int, int]:
    """Which team threads to pin where: {index: CPU} for each thread (never index 0, the master) whose CPU an earlier
    thread of the team already runs on, each to an allowed CPU none of the team runs on, while any is left."""
    free = sorted(allowed - set(cpus))
    seen: set[int] = set()
    moves = {}
    for k, cpu in enumerate(cpus):
        if cpu in seen and k > 0 and free:
            moves[k] = free.pop(0)
        else:
            seen.add(cpu)
    return moves


def cpu_of(tid: int) -> int | None:
    """The CPU thread `tid` of this process last ran on; None when it cannot be read (the thread has gone)."""
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as f:  # bytes: a thread's name need not be UTF-8
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[36])  # field 39 of stat(5); fields[0] is field 3 (the state)
    except (OSError, IndexError, ValueError):
        return None


def team_thread_ids(run_region: Callable[[int, np.ndarray], bool], job_words: Callable[[int], np.ndarray],
                    size: int) -> list[int] | None:
    """The kernel thread ids of the calling thread's OpenMP team of `size` threads, master first; None when the
    region could not run or a thread did not answer. `run_region` and `job_words`: threads.run_native and
    threads.region_job (passed in: threads.py imports this module)."""
    address = gettid_address()
    if address is None or size < 2:
        return None
    out = np.zeros(size, np.int64)
    job = job_words(TID_LEN)
    job[TID_GETTID], job[TID_OUT], job[TID_CAP] = address, out.ctypes.data, size
    if not run_region(team_tids().address, job) or not out.all():
        return None
    return [int(t) for t in out]


# Pins are taken only where the team's threads fill most of the allowed CPUs (the shared-vCPU state was seen on 2
# vCPUs): on a larger host a CPU "free of the team" may well be busy with other work, and a pin would keep a worker
# there for good.
MAX_ALLOWED_CPUS = 4
_disabled: list[str] = []  # why spread_team does nothing in this process (said once in the log)
# A pin is kept this long at least; a busy-looking run after it gives the worker the mask it had back (spread_team).
PIN_HOLD_S = 30.0
_pins: dict[int, tuple[float, frozenset[int]]] = {}  # thread id -> (when it was pinned, the mask it had)
_pins_lock = threading.Lock()  # only tried: another guard at it (or a fork that left it held) skips the release


def stale_pins(pins: dict[int, tuple[float, frozenset[int]]], now: float, hold: float = PIN_HOLD_S) -> list[int]:
    """The thread ids pinned at least `hold` seconds before `now`."""
    return [tid for tid, (since, _) in pins.items() if now - since >= hold]


def _release_stale() -> None:
    """Gives each worker pinned PIN_HOLD_S ago or longer the mask it had back, if it is still a thread of this
    process (a thread id that has gone may be another process's by now)."""
    if not _pins or not _pins_lock.acquire(blocking=False):
        return
    try:
        for tid in stale_pins(_pins, time.monotonic()):
            _, mask = _pins.pop(tid)
            if os.path.exists(f"/proc/self/task/{tid}"):
                try:
                    os.sched_setaffinity(tid, mask)
                except OSError:  # gone meanwhile
                    pass
    finally:
        _pins_lock.release()


def _forget_pins() -> None:
    """In a forked child: the parent's threads are not its own (and a lock a parent thread held stays held)."""
    global _pins_lock
    _pins.clear()
    _pins_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pins)


def _disable(why: str) -> bool:
    if not _disabled:
        _disabled.append(why)
        log.info("OpenMP threads that share one CPU are not moved apart in this process: %s", why)
    return False


# A CPU takes a pin only when it was idle at least IDLE_SHARE of the window IdleWatch read it over. The window is
# at least WINDOW_MIN_S (/proc/stat counts in 10 ms ticks) and at most WINDOW_MAX_S (older says nothing of now).
IDLE_SHARE = 0.5
WINDOW_MIN_S = 0.1
WINDOW_MAX_S = 5.0


def cpu_times(text: bytes) -> dict[int, tuple[int, int]]:
    """{CPU: (idle ticks, all ticks)} from /proc/stat's per-CPU lines (idle and iowait count as idle; guest time is
    inside user time already, so it is left out of the sum)."""
    times = {}
    for line in text.splitlines():
        name, *fields = line.split()
        if not (name.startswith(b"cpu") and name[3:].isdigit()):
            continue
        ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
        times[int(name[3:])] = (sum(ticks[3:5]), sum(ticks))
    return times


def idle_cpus(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]], share: float) -> set[int]:
    """The CPUs idle at least `share` of the ticks between two cpu_times readings (a CPU that counted none is not)."""
    idle = set()
    for cpu, (idle1, all1) in after.items():
        idle0, all0 = before.get(cpu, (idle1, all1))
        if all1 > all0 and (idle1 - idle0) >= share * (all1 - all0):
            idle.add(cpu)
    return idle


class IdleWatch:
    """Which of the `allowed` CPUs were mostly idle lately: a window opens at the first call; a later call at least
    WINDOW_MIN_S on answers for it and opens the next; a call while the window is too short (kept) gets the last
    answer again. None before the first answer, once the window grew stale (a new one opens), where /proc/stat
    cannot be read, and for good once it did not list every allowed CPU."""

    def __init__(self, read: Callable[[], bytes] | None = None, clock: Callable[[], float] = time.monotonic):
        self._read = read or _read_proc_stat
        self._clock = clock
        self._lock = threading.Lock()  # guards of several instance threads ask at once
        self._since: tuple[float, dict[int, tuple[int, int]]] | None = None
        self._answer: set[int] | None = None  # the idle CPUs of the window that closed when the open one opened
        self.renumbered = False  # /proc/stat's CPUs are not the affinity mask's (LXCFS): never an answer

    def __call__(self, allowed: set[int]) -> set[int] | None:
        if self.renumbered or not self._lock.acquire(blocking=False):  # another guard reads now (or a fork left
            return None  # it held): no answer
        try:
            now = self._clock()
            if self._since is not None and now - self._since[0] < WINDOW_MIN_S:
                # too short to read: the last window's answer, for a window that ended under WINDOW_MIN_S ago (it
                # may have lasted up to WINDOW_MAX_S); a burst's busy-looking runs come closer together than that
                return None if self._answer is None else self._answer & allowed
            try:
                times = cpu_times(self._read())
            except (OSError, ValueError):
                return None
            since, self._since = self._since, (now, times)
            self._answer = None
            if not allowed <= times.keys():
                self.renumbered = True
                log.info("OpenMP threads that share one CPU are not moved apart: /proc/stat does not list CPUs %s "
                         "of the affinity mask (a container that renumbers them)", sorted(allowed - times.keys()))
                return None
            if since is None or now - since[0] > WINDOW_MAX_S:
                return None
            self._answer = idle_cpus(since[1], times, IDLE_SHARE)
            return self._answer & allowed
        finally:
            self._lock.release()


@functools.cache
def proc_stat_mounted(mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether something is mounted over /proc/stat (LXCFS in a container: per-CPU lines from the container's own
    usage, so a CPU a neighbour keeps busy reads idle, whatever its numbering); read once a process."""
    try:
        with open(mountinfo, "rb") as f:
            text = f.read(1 << 22)
    except OSError:
        return False
    return any(len(fields) > 4 and fields[4] == b"/proc/stat"
               for fields in (line.split() for line in text.splitlines()))


def _read_proc_stat() -> bytes:
    with open("/proc/stat", "rb") as f:
        return f.read(1 << 20)  # ~150 bytes a CPU: far below the limit on any host this module pins on


def procs_running(text: bytes) -> int | None:
    """The host's runnable threads now (the running ones and those waiting for a CPU), from /proc/stat's
    procs_running line; None where it has none, or a count below 1: the reader itself runs, so a 0 is a /proc
    that does not count (gVisor's prints 0 always)."""
    for line in text.splitlines():
        if line.startswith(b"procs_running "):
            try:
                n = int(line.split()[1])
            except (IndexError, ValueError):
                return None
            return n if n >= 1 else None
    return None


def run_queue() -> int | None:
    """procs_running of this host's /proc/stat now; None where it cannot be read."""
    try:
        return procs_running(_read_proc_stat())
    except OSError:
        return None


def spread_team(run_region: Callable[[int, np.ndarray], bool], job_words: Callable[[int], np.ndarray],
                size: int, idle: Callable[[set[int]], set[int] | None], allowed: set[int],
                running: Callable[[], int | None] = run_queue, host_cpus: int | None = None) -> bool:
    """Whether the busy-looking run just ended was the team's own doing, not other work's; workers of the calling
    thread's team of `size` threads that share a CPU with another team thread are pinned apart on the way, each to a
    CPU of `allowed` (the process's affinity mask: the caller's thread is never pinned here, so it is the intended
    set) none of the team runs on and `idle` (an IdleWatch) names mostly idle lately (`spread_plan`).

    Where the mask is the whole host (`host_cpus`, os.cpu_count() by default), the host's run queue just after the
    run answers (`running`, the team's own threads included): no more runnable threads than allowed CPUs is room,
    the switches were the team's (threads woken together on one CPU take turns at every fork and join). Where the
    mask is narrower, the host's queue says nothing of its CPUs: the run was the team's own when two of its threads
    shared a CPU and one of them could be moved to an idle one. Answers False past MAX_ALLOWED_CPUS allowed CPUs,
    without gettid, once pinning was refused, and where the run queue cannot be read. The caller leaves it uncalled
    where the user binds OpenMP's threads (CpuOptions.openmp_bound)."""
    _release_stale()  # first: whatever stops new pins below must not keep old ones for good
    if _disabled:
        return False
    if gettid_address() is None:
        return _disable("this libc has no gettid (glibc before 2.30)")
    if len(allowed) > MAX_ALLOWED_CPUS or len(allowed) < 2:
        return False
    if proc_stat_mounted():
        return _disable("/proc/stat is mounted over (LXCFS): its idle times are this container's, not the CPUs'")
    whole_host = (os.cpu_count() if host_cpus is None else host_cpus) == len(allowed)
    if whole_host:
        queued = running()  # first: a busy host is told without a region for the team's ids
        if queued is None or queued > len(allowed):
            return False
    targets = idle(allowed)
    moved = bool(targets) and _spread(run_region, job_words, size, targets)
    return whole_host or moved


def _spread(run_region: Callable[[int, np.ndarray], bool], job_words: Callable[[int], np.ndarray], size: int,
            targets: set[int]) -> bool:
    """spread_team's pins: each worker that shares a CPU with an earlier thread of the team, to one of `targets`;
    whether any was moved."""
    tids = team_thread_ids(run_region, job_words, size)
    if tids is None:
        return False
    cpus = [cpu_of(t) for t in tids]
    if None in cpus or len(set(cpus)) == len(cpus):
        return False  # a thread gone, or no two share a CPU
    moved = False
    for k, cpu in spread_plan(cpus, targets).items():
        try:
            mask = frozenset(os.sched_getaffinity(tids[k]))
            os.sched_setaffinity(tids[k], {cpu})
        except PermissionError:
            return _disable("the container forbids sched_setaffinity")
        except OSError:  # the thread has gone meanwhile
            continue
        moved = True
        if _pins_lock.acquire(timeout=0.1):  # bounded: a fork may have left it held
            _pins[tids[k]] = (time.monotonic(), mask)
            _pins_lock.release()
        log.debug("OpenMP thread %d of this team shared CPU %d with another of the team while CPU %d was free: "
                  "pinned it there", k, cpus[k], cpu)
    return moved
