"""colocation.py: an instance's OpenMP threads that share one CPU while another is free are moved apart."""

from __future__ import annotations

import os
import threading
import time

import pytest
from op_harness import cpu_device

from engine.devices.cpu import colocation
from engine.devices.cpu import threads as T


def test_the_plan_moves_each_worker_that_shares_a_cpu_to_a_free_one_never_the_master():
    assert colocation.spread_plan([1, 1], {0, 1}) == {1: 0}
    assert colocation.spread_plan([0, 1], {0, 1}) == {}
    assert colocation.spread_plan([2, 2, 2, 5], {2, 3, 4, 5}) == {1: 3, 2: 4}
    assert colocation.spread_plan([0, 0, 0], {0, 1}) == {1: 1}  # no CPU left for the third
    assert colocation.spread_plan([3, 3], {3}) == {}  # one CPU allowed: nowhere to go
    assert colocation.spread_plan([0, 1, 0], {0, 1, 2}) == {2: 2}


def test_cpu_of_reads_where_a_thread_last_ran():
    assert colocation.cpu_of(threading.get_native_id()) in os.sched_getaffinity(0)
    assert colocation.cpu_of(2**31 - 1) is None


@pytest.fixture
def team(monkeypatch):
    """The calling thread's OpenMP team of two: skips where our kernels do not run on OpenMP's team, outside the
    2-4 allowed CPUs where pins are taken, where the user binds OpenMP's threads, or libc has no gettid; restores
    every thread's affinity afterwards."""
    cpu_device()
    monkeypatch.setattr(colocation, "_disabled", [])
    allowed = set(os.sched_getaffinity(0))
    if T.pool_kind(T.get_policy(), T._openmp is not None) != "openmp":
        pytest.skip("needs our kernels on OpenMP's team (oneDNN, the `run` policy)")
    if not 2 <= len(allowed) <= colocation.MAX_ALLOWED_CPUS or any(os.environ.get(v) for v in colocation.USER_BINDING):
        pytest.skip("pins are taken on 2-4 allowed CPUs only, and never where the user binds OpenMP's threads")
    if colocation.gettid_address() is None:
        pytest.skip("this libc has no gettid")
    before = T.get_threads()
    T.set_threads(2)
    tids = None
    try:
        tids = colocation.team_thread_ids(T.run_native, T.region_job, 2)
        yield tids, allowed
    finally:
        for tid in tids or []:
            try:
                os.sched_setaffinity(tid, allowed)
            except OSError:
                pass
        T.set_threads(before)


def test_a_team_forced_onto_one_cpu_is_moved_apart(team):
    """The master first, then the worker, as the region reports them; both pinned to one CPU (what the scheduler did
    under bursts on a 2-vCPU VM), spread_team pins the worker to another allowed CPU and leaves the master alone."""
    tids, allowed = team
    assert tids is not None and len(set(tids)) == 2 and tids[0] == threading.get_native_id()
    one = min(allowed)
    for tid in tids:
        os.sched_setaffinity(tid, {one})
    assert colocation.team_thread_ids(T.run_native, T.region_job, 2) == tids  # the worker has run on `one` now
    assert [colocation.cpu_of(t) for t in tids] == [one, one]
    # the master stays pinned to `one` (so it cannot move off it meanwhile); the process's set is given instead
    assert not colocation.spread_team(T.run_native, T.region_job, 2, lambda: set(), allowed)  # no CPU idle: no pin
    assert os.sched_getaffinity(tids[1]) == {one}
    assert colocation.spread_team(T.run_native, T.region_job, 2, lambda: allowed - {one}, allowed)
    moved = os.sched_getaffinity(tids[1])
    assert len(moved) == 1 and one not in moved and moved <= allowed
    assert os.sched_getaffinity(tids[0]) == {one}  # the master is the test's own pin, untouched

def test_nothing_moves_where_the_user_binds_threads_or_on_large_hosts(monkeypatch):
    monkeypatch.setattr(colocation, "_disabled", [])
    monkeypatch.setattr(colocation, "team_thread_ids", lambda *a: pytest.fail("no team should be asked"))
    monkeypatch.setattr(colocation.os, "sched_getaffinity", lambda pid: set(range(8)))
    never = lambda: pytest.fail("no idle CPUs should be asked")  # noqa: E731
    assert not colocation.spread_team(None, None, 2, never)  # 8 CPUs: past MAX_ALLOWED_CPUS
    monkeypatch.setenv("OMP_PROC_BIND", "close")
    assert not colocation.spread_team(None, None, 2, never) and colocation._disabled  # and said once


STAT = b"""cpu  300 0 30 700 0 0 0 0 0 0
cpu0 {} 0 10 {} 5 0 0 0 0 0
cpu1 {} 0 10 {} 0 0 0 5 0 0
intr 1 2 3
"""


def test_cpu_times_and_idle_cpus_read_proc_stat():
    before = colocation.cpu_times(STAT.replace(b"{}", b"100"))
    assert before == {0: (105, 215), 1: (100, 215)}  # iowait is idle; steal counts in the whole
    # over the window cpu0 ran 90 ticks of 100, cpu1 idled 95 of 100
    after = colocation.cpu_times(STAT.replace(b"{}", b"%d") % (190, 110, 105, 195))
    assert colocation.idle_cpus(before, after, 0.5) == {1}
    assert colocation.idle_cpus(before, before, 0.5) == set()  # no ticks: nothing known idle
    assert colocation.idle_cpus({}, after, 0.5) == set()  # a CPU first seen now has no window


def test_the_idle_watch_answers_for_windows_of_a_tenth_of_a_second_to_five():
    now, reads = [0.0], []
    stats = iter([STAT.replace(b"{}", b"100"), STAT.replace(b"{}", b"%d") % (190, 110, 105, 195),
                  STAT.replace(b"{}", b"%d") % (200, 111, 106, 196)])
    watch = colocation.IdleWatch(read=lambda: (reads.append(1), next(stats))[1], clock=lambda: now[0])
    assert watch() is None and len(reads) == 1  # the window opens
    now[0] = 0.05
    assert watch() is None and len(reads) == 1  # too short: kept, /proc/stat not read
    now[0] = 0.3
    assert watch() == {1}  # answers for 0-0.3 s, opens the next
    now[0] = 10.0
    assert watch() is None  # 9.7 s: stale, a new window opens
    broken = colocation.IdleWatch(read=lambda: (_ for _ in ()).throw(OSError("no /proc")))
    assert broken() is None and broken() is None


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="no /proc/stat on this host")
def test_a_real_idle_watch_reads_this_hosts_cpus():
    watch = colocation.IdleWatch()
    assert watch() is None
    busy_until = time.monotonic() + colocation.WINDOW_MIN_S * 1.5
    while time.monotonic() < busy_until:  # this thread keeps one CPU busy for the window
        pass
    idle = watch()
    with open("/proc/stat", "rb") as f:
        assert idle is not None and idle <= set(colocation.cpu_times(f.read()))
