"""Keep-warm threads: one per CPU of the pool, at the lowest priority Linux has (SCHED_IDLE), spinning while a run
is in progress and sleeping otherwise (loops/warm.py), so that the CPUs a request's threads hand work to are
awake when the hand-over comes.

Why: under the default wait policy (threads.py) a kernel thread that waits more than a few microseconds sleeps,
and on a virtual machine a CPU with nothing to run halts: waking a thread there means waking the virtual CPU
through the hypervisor, 100-250 us on the hosts we measured, on every fork and join between two ops. A CPU that
runs an idle-priority spinner does not halt, and the kernel still gives it to any other thread at once (an
idle-priority thread is preempted by every normal wake-up and gets almost no share of a busy CPU), so a woken
kernel thread starts in microseconds, and on a busy host the spinners take nothing from anyone: they cost only CPU
that would otherwise idle, and only while a run is in progress. An idle server's spinners sleep.

Not where a cgroup quota limits the process (a Kubernetes CPU limit): an idle-priority thread's time still counts
against the quota, and spending it would get the whole container throttled. NNSERVE_KEEP_WARM (CpuOptions) says
`0` (never) or `1` (even under a quota).
"""

from __future__ import annotations

import os
import threading

import numpy as np

from engine.devices.cpu.loops.warm import SUPPORTED, futex_wake, keep_warm

SLEEP_TIMEOUT_NS = 100_000_000  # the longest one sleep lasts: a wake-up lost to a race costs this much once


class WarmCpus:
    """`count` keep-warm threads; `set_runs(n)` tells them how many runs are in progress (the caller serialises
    its calls)."""

    def __init__(self, count: int, grace_polls: int):
        self.word = np.zeros(16, np.int32)  # runs in progress in word 0 (a futex word: 32 bits), own cache line
        self.stop = np.zeros(8, np.int64)
        self.timeout = np.array([0, SLEEP_TIMEOUT_NS], np.int64)
        keep_warm(self.word, np.ones(8, np.int64), self.timeout, 0)  # compiled here, not in the threads
        self.failures: list[BaseException] = []
        started = [threading.Event() for _ in range(count)]
        self.threads = [threading.Thread(target=self._spin, args=(grace_polls, started[i]), daemon=True,
                                         name=f"nnserve-warm-{i}") for i in range(count)]
        for t in self.threads:
            t.start()
        for e in started:
            e.wait()
        if self.failures:
            self.close()
            raise self.failures[0]

    def _spin(self, grace_polls: int, started: threading.Event) -> None:
        try:
            # only this thread (0 is the calling thread in Linux's per-thread scheduling); never spin at a
            # normal priority: that would take CPU from the requests' own threads on a busy host
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError as e:  # e.g. a seccomp profile that forbids sched_setscheduler
            self.failures.append(e)
            started.set()
            return
        started.set()
        keep_warm(self.word, self.stop, self.timeout, grace_polls)

    def set_runs(self, runs: int) -> None:
        was = self.word[0]
        self.word[0] = runs
        if was == 0 and runs > 0:
            futex_wake(self.word.ctypes.data)

    def close(self) -> None:
        self.stop[0] = 1
        futex_wake(self.word.ctypes.data)


def wanted(setting: str, threads: int, quota: int | None) -> bool:
    """Whether to keep CPUs warm: `setting` is NNSERVE_KEEP_WARM ("auto", "0", "1"), `threads` the pool's count,
    `quota` the cgroup's CPU quota (None: none). Pure, for the tests; `1` where the platform has no futex is an
    error, not a silent no."""
    if setting == "1" and not SUPPORTED:
        raise ValueError("NNSERVE_KEEP_WARM=1: keep-warm threads need Linux on x86-64 or AArch64 (a futex and "
                         "SCHED_IDLE); set it to auto or 0 here")
    if setting == "0" or threads <= 1 or not SUPPORTED:
        return False
    return setting == "1" or quota is None
