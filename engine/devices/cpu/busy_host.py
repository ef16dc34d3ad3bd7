"""Whether OpenMP's threads may spin through a request: only while the host is calm (Intel's OpenMP, `run` policy).

Intel's runtime spins its idle threads for the blocktime (20 ms under `run`, onednn/binding.py), so a request's
split ops never wait for a sleeping thread. On a host busy with other work that is ruinous: a thread spinning at a
barrier for a partner that has no core holds a core itself, the partner gets it only at the next time slice, and
every op pays that. Beside two busy loops on 2 vCPUs (bench/RESULTS.md "Wait policy", 2026-11-27 23:38) a 20 ms
blocktime made GhostNet take 261 ms a call and DeiT-tiny 394 ms, against 15 and 49 ms on libgomp's 100 us spin.

So each measured run counts the process's involuntary context switches (getrusage: a thread preempted while it
wanted to run). A calm host shows a few a run, about one per scheduler tick of a spinning thread at most (measured
0-5 on runs of 6-17 ms); a busy one tens to hundreds. One run above `BUSY_FLOOR` + one per `TICK_MS` of its wall
time turns spinning off (blocktime 0: threads sleep after each op, as libgomp's do after their short spin), and it
comes back after `CALM_RUNS` calm measured runs in a row (a run that failed does not count). After a run shorter
than SHORT_RUN_S, a run is measured with probability 1 / SHORT_EVERY (at random, not every eighth: a short model
and a long one taking turns would otherwise keep the long one unmeasured for good). Before a run counts as busy,
colocation.py is asked whether the host had room for it (where the affinity mask is the whole host, its run queue:
no more runnable threads than CPUs); then the switches were the team's own (its threads woken together on one CPU
after an idle pause, as bursts of requests do), the run counts as calm and workers that share a CPU are moved
apart. Without that, the first such run of a burst turned spinning
off, the sleeping threads kept meeting on one CPU, and the state never ended under sporadic traffic (MobileNetV2
batch 1: 6-7 ms a call against 3); beside two busy loops (bench/wait_policy.py, busy traffic, 2026-11-29) the
run-queue verdict left MobileNetV2, GhostNet and ResNet-18 as they were (18.2, 24.7, 40.7 ms a call against 18.6,
24.0, 40.2 before it). With the guard, beside the same busy
loops: 1.06-1.60x libgomp's time, no collapse (2026-11-28 00:16). The blocktime is an OpenMP setting of the
calling thread (its team's), so each thread that runs sets it at the start of a run when the state changed since its
last one.
"""

from __future__ import annotations

import logging
import random
import resource
import threading
import time
from collections.abc import Callable

BUSY_FLOOR = 4  # involuntary switches a calm run may show whatever its length
TICK_MS = 4  # ... plus one per scheduler tick (250 Hz) of its wall time
CALM_RUNS = 16  # calm runs in a row before the threads spin again
# After a run shorter than SHORT_RUN_S a run is measured with probability 1 / SHORT_EVERY: the two getrusage calls
# and the test cost a one-op graph ~2 us of its ~15 (softmax over 1000 values), and a run that short seldom sees a
# scheduler tick; a longer measured run measures every run again. At random: the state is the process's, and
# traffic of a short and a long model in turn would keep a counter's sample on the short one.
SHORT_RUN_S = 200e-6
SHORT_EVERY = 8
_random = random.random

log = logging.getLogger("engine.devices.cpu")


def busy(preempted: int, wall_s: float) -> bool:
    """Whether a run of `wall_s` seconds with `preempted` involuntary context switches says the host is busy."""
    return preempted > BUSY_FLOOR + wall_s * 1000 / TICK_MS


def next_calm(calm: int, was_busy: bool) -> int:
    """Calm runs in a row after one more run (capped: only `>= CALM_RUNS` matters)."""
    return 0 if was_busy else min(calm + 1, CALM_RUNS)


class SpinGuard:
    """The process's calm-run count and each thread's blocktime; `begin` and `end` bracket every run.

    `set_blocktime` / `get_blocktime`: the runtime's kmp_set_blocktime / kmp_get_blocktime. The spinning value is
    the one the runtime started with (read before any set): its unit is the runtime's own (milliseconds, or
    microseconds once KMP_BLOCKTIME was given in them), so it is handed back as read, never converted."""

    def __init__(self, set_blocktime, get_blocktime, spread: Callable[[], bool] | None = None):
        self._set = set_blocktime
        self._spread = spread  # colocation.spread_team for the calling thread's team; True: the host had room
        self._spread_failed = False
        self.spin = int(get_blocktime())
        self.calm = CALM_RUNS  # spinning until a run says otherwise
        self._short = False  # the last measured run was shorter than SHORT_RUN_S
        self.after_fork()

    def after_fork(self) -> None:
        """A fresh lock and per-thread record: a forked child's runtime starts from its environment's blocktime,
        and a lock held by another thread at the fork would never be released there."""
        self._lock = threading.Lock()
        self._local = threading.local()

    def target(self) -> int:
        return self.spin if self.calm >= CALM_RUNS else 0

    def begin(self) -> tuple[int, float] | None:
        """What `end` compares the run with; None for a run left unmeasured (after a short one: SHORT_EVERY)."""
        want = self.target()
        if getattr(self._local, "blocktime", None) != want:
            self._set(want)  # this thread's team takes it at its next fork
            self._local.blocktime = want
        if self._short and _random() * SHORT_EVERY >= 1.0:
            return None
        return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw, time.perf_counter()

    def _spreads(self) -> bool:
        """`spread`, whose failure must not fail the run it follows: logged once, then taken as nothing moved."""
        try:
            return bool(self._spread())
        except Exception:  # noqa: BLE001 - an optimisation's error; the request's outputs are already right
            if not self._spread_failed:
                self._spread_failed = True
                log.warning("checking the OpenMP team's CPUs failed; a busy-looking run turns spinning off as before",
                            exc_info=True)
            return False

    def end(self, started: tuple[int, float] | None) -> None:
        if started is None:
            return
        switches, t0 = started
        preempted = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - switches
        wall = time.perf_counter() - t0
        self._short = wall < SHORT_RUN_S
        was_busy = busy(preempted, wall)
        if was_busy and self._spread is not None and self._spreads():
            was_busy = False  # the team's own switches: the host had room for it (colocation.py)
        with self._lock:
            self.calm = next_calm(self.calm, was_busy)
