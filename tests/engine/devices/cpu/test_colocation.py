"""colocation.py: an instance's OpenMP threads that share one CPU while another is free are moved apart."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import pytest
from op_harness import cpu_device

from engine.devices.cpu import colocation
from engine.devices.cpu import threads as T
from engine.devices.cpu.options import CpuOptions, openmp_bound


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
    monkeypatch.setattr(colocation, "_pins", {})
    allowed = set(os.sched_getaffinity(0))
    if T.pool_kind(T.get_policy(), T._openmp is not None) != "openmp":
        pytest.skip("needs our kernels on OpenMP's team (oneDNN, the `run` policy)")
    if not 2 <= len(allowed) <= colocation.MAX_ALLOWED_CPUS or CpuOptions.from_env(os.environ).openmp_bound:
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
    room, crowded = (lambda: len(allowed)), (lambda: len(allowed) + 1)
    others = lambda cpus: cpus - {one}  # noqa: E731
    host = len(allowed)
    assert not colocation.spread_team(T.run_native, T.region_job, 2, others, allowed, crowded, host)  # busy: no pin
    assert os.sched_getaffinity(tids[1]) == {one} and not colocation._pins
    assert colocation.spread_team(T.run_native, T.region_job, 2, lambda cpus: set(), allowed, room, host)  # none idle:
    assert os.sched_getaffinity(tids[1]) == {one} and not colocation._pins  # the team's own switches, but no pin
    assert colocation.spread_team(T.run_native, T.region_job, 2, others, allowed, room, host)
    assert tids[1] in colocation._pins and tids[0] not in colocation._pins
    moved = os.sched_getaffinity(tids[1])
    assert len(moved) == 1 and one not in moved and moved <= allowed
    assert os.sched_getaffinity(tids[0]) == {one}  # the master is the test's own pin, untouched

def test_a_pin_held_long_enough_is_handed_back_on_a_busy_run(team, monkeypatch):
    """A worker pinned PIN_HOLD_S ago gets the whole mask back when a busy-looking run asks again (its CPU may be
    another process's now), before anything is pinned anew; a younger pin stays."""
    tids, allowed = team
    monkeypatch.setattr(colocation, "_pins", {})
    one = min(allowed)
    os.sched_setaffinity(tids[1], {one})
    colocation._pins[tids[1]] = (time.monotonic(), frozenset(allowed))
    crowded = lambda: len(allowed) + 1  # noqa: E731
    assert not colocation.spread_team(T.run_native, T.region_job, 2, lambda cpus: set(), allowed, crowded,
                                      len(allowed))
    assert os.sched_getaffinity(tids[1]) == {one}  # young: kept
    colocation._pins[tids[1]] = (time.monotonic() - colocation.PIN_HOLD_S, frozenset(allowed))
    # released before anything that stops new pins: here a mask past MAX_ALLOWED_CPUS
    assert not colocation.spread_team(T.run_native, T.region_job, 2, lambda cpus: set(), set(range(64)), crowded)
    assert os.sched_getaffinity(tids[1]) == allowed and not colocation._pins  # the mask it had, not the caller's
    colocation._pins[2**22 + 7] = (0.0, frozenset(allowed))  # a thread id not of this process: left alone
    colocation._release_stale()
    assert not colocation._pins


def test_a_forked_child_forgets_the_parents_pins(monkeypatch):
    monkeypatch.setattr(colocation, "_pins", {threading.get_native_id(): (0.0, frozenset(os.sched_getaffinity(0)))})
    pid = os.fork()
    if pid == 0:  # the child: nothing of the parent's to release
        os._exit(0 if not colocation._pins else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert colocation._pins  # the parent's own record stays


def test_proc_stat_mounted_over_is_seen_in_mountinfo(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("22 1 0:21 / /proc rw,nosuid - proc proc rw\n")
    lxcfs = tmp_path / "lxcfs"
    lxcfs.write_text("22 1 0:21 / /proc rw - proc proc rw\n"
                     "31 22 0:33 /proc/stat /proc/stat rw,nosuid - fuse.lxcfs lxcfs rw,user_id=0\n")
    assert not colocation.proc_stat_mounted(str(plain))
    assert colocation.proc_stat_mounted(str(lxcfs))
    assert not colocation.proc_stat_mounted(str(tmp_path / "absent"))


def test_stale_pins_are_those_held_long_enough():
    mask = frozenset({0, 1})
    pins = {11: (100.0, mask), 12: (129.0, mask), 13: (130.5, mask)}
    assert colocation.stale_pins(pins, 130.0, 30.0) == [11]
    assert colocation.stale_pins(pins, 160.5, 30.0) == [11, 12, 13]
    assert colocation.stale_pins({}, 1e9) == []


def test_nothing_moves_on_large_hosts(monkeypatch):
    monkeypatch.setattr(colocation, "_disabled", [])
    monkeypatch.setattr(colocation, "team_thread_ids", lambda *a: pytest.fail("no team should be asked"))
    never = lambda cpus: pytest.fail("no idle CPUs should be asked")  # noqa: E731
    room = lambda: 1  # noqa: E731
    assert not colocation.spread_team(None, None, 2, never, set(range(8)), room)  # past MAX_ALLOWED_CPUS
    assert not colocation.spread_team(None, None, 2, never, {3}, room)  # nowhere to go


def test_a_busy_looking_run_is_the_teams_own_while_the_run_queue_has_room(monkeypatch):
    """The verdict is the host's run queue just after the run, whether or not the team still shares a CPU then
    (seen apart again by the end of runs with 20-110 switches): no more runnable threads than allowed CPUs is
    room (the team's own switches); more, or a queue that cannot be read, is a busy host, told without asking the
    team or the idle CPUs."""
    monkeypatch.setattr(colocation, "_disabled", [])
    monkeypatch.setattr(colocation, "proc_stat_mounted", lambda: False)
    monkeypatch.setattr(colocation, "gettid_address", lambda: 1)
    asked = []
    monkeypatch.setattr(colocation, "team_thread_ids", lambda *a: asked.append("team") or None)
    idle = lambda cpus: asked.append("idle") or set()  # noqa: E731
    for queued, own in ((1, True), (2, True), (3, False), (None, False)):
        asked.clear()
        assert colocation.spread_team(None, None, 2, idle, {0, 1}, lambda q=queued: q, host_cpus=2) is own
        assert asked == (["idle"] if own else [])  # nothing idle: no team asked, no pin
    asked.clear()
    assert colocation.spread_team(None, None, 2, lambda cpus: {1}, {0, 1}, lambda: 2, host_cpus=2)  # ids unreadable
    assert asked == ["team"]
    assert colocation.spread_team(None, None, 4, lambda cpus: {1}, {0, 1, 2, 3}, lambda: 4, host_cpus=4)
    assert not colocation.spread_team(None, None, 4, lambda cpus: {1}, {0, 1, 2, 3}, lambda: 5, host_cpus=4)


def test_a_mask_narrower_than_the_host_takes_the_teams_own_sharing_not_the_hosts_queue(monkeypatch):
    """A 2-CPU cpuset of a 64-CPU host: the host-wide run queue says nothing of the mask's CPUs (never asked); a
    busy-looking run is the team's own only where two of its threads shared a CPU and one was moved to an idle one."""
    monkeypatch.setattr(colocation, "_disabled", [])
    monkeypatch.setattr(colocation, "proc_stat_mounted", lambda: False)
    monkeypatch.setattr(colocation, "gettid_address", lambda: 1)
    never = lambda: pytest.fail("the host's run queue should not be asked")  # noqa: E731
    moved = [True]
    monkeypatch.setattr(colocation, "_spread", lambda *a: moved[0])
    assert colocation.spread_team(None, None, 2, lambda cpus: {1}, {0, 1}, never, host_cpus=64)
    moved[0] = False  # the team apart, or nowhere to move
    assert not colocation.spread_team(None, None, 2, lambda cpus: {1}, {0, 1}, never, host_cpus=64)
    assert not colocation.spread_team(None, None, 2, lambda cpus: set(), {0, 1}, never, host_cpus=64)
    assert not colocation.spread_team(None, None, 2, lambda cpus: None, {0, 1}, never, host_cpus=64)


def test_the_run_queue_is_read_from_proc_stat():
    assert colocation.procs_running(b"cpu  1 2 3\nctxt 99\nprocs_running 3\nprocs_blocked 0\n") == 3
    assert colocation.procs_running(b"cpu  1 2 3\nprocs_blocked 0\n") is None
    assert colocation.procs_running(b"procs_running x\n") is None
    assert colocation.procs_running(b"procs_running 0\n") is None  # a /proc that does not count (gVisor's)
    assert colocation.procs_running(b"procs_running -3\n") is None
    if os.path.exists("/proc/stat"):
        assert colocation.run_queue() >= 1  # this thread runs


@pytest.mark.parametrize(("env", "bound"), [
    ({}, False), ({"OMP_PROC_BIND": "close"}, True), ({"OMP_PROC_BIND": "FALSE"}, False),
    ({"OMP_PROC_BIND": "spread,close"}, True), ({"OMP_PLACES": "cores"}, True),
    ({"OMP_PLACES": "cores", "OMP_PROC_BIND": "false"}, False), ({"GOMP_CPU_AFFINITY": "0-3"}, True),
    ({"KMP_AFFINITY": "granularity=fine,compact,1,0"}, True), ({"KMP_AFFINITY": "verbose"}, False),
    ({"KMP_AFFINITY": "none"}, False), ({"KMP_AFFINITY": "disabled"}, False),
    ({"KMP_AFFINITY": "explicit,proclist=[0,1]"}, True), ({"OMP_PROC_BIND": " "}, False),
    ({"OMP_PROC_BIND": "false", "KMP_AFFINITY": "compact"}, True),  # Intel's runtime: KMP_AFFINITY wins
])
def test_the_users_own_binding_is_read_from_openmps_variables(env, bound):
    """Where it binds, the device never hands the busy-host guard a spread (threads.use_openmp's move_apart)."""
    assert CpuOptions.from_env(env).openmp_bound is bound
    assert openmp_bound({k: v.strip().lower() for k, v in env.items()}) is bound


def test_options_made_in_code_see_the_processs_own_binding(monkeypatch):
    """OpenMP reads the process's environment whatever the device's options say: CpuOptions() (a device made in
    code, get_device("cpu")) takes the binding from it too."""
    for name in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY"):
        monkeypatch.delenv(name, raising=False)
    assert not CpuOptions().openmp_bound
    monkeypatch.setenv("OMP_PROC_BIND", "close")
    assert CpuOptions().openmp_bound and not CpuOptions.from_env({}).openmp_bound


def test_the_guard_gets_no_spread_where_the_user_binds_threads(monkeypatch):
    made = []
    monkeypatch.setattr(T, "SpinGuard", lambda *a, spread=None: made.append(spread))
    monkeypatch.setattr(T, "_drop_pool", lambda: None)
    for name in ("_fork_work", "_intel"):
        monkeypatch.setattr(T, name, getattr(T, name))  # put back afterwards
    for move_apart in (False, True):
        monkeypatch.setattr(T, "_openmp", None)
        monkeypatch.setattr(T, "_guard", None)
        T.use_openmp(SimpleNamespace(kmp_set_blocktime=None, kmp_get_blocktime=None), True, 20, T.WaitPolicy(),
                     move_apart=move_apart)
    assert made[0] is None and callable(made[1])


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
    assert watch({0, 1}) is None and len(reads) == 1  # the window opens
    now[0] = 0.05
    assert watch({0, 1}) is None and len(reads) == 1  # too short: kept, /proc/stat not read
    now[0] = 0.3
    assert watch({0, 1}) == {1}  # answers for 0-0.3 s, opens the next
    now[0] = 0.35
    assert watch({0, 1}) == {1} and watch({0}) == set() and len(reads) == 2  # too short: the last answer again
    now[0] = 10.0
    assert watch({0}) is None  # 9.7 s: stale, a new window opens
    now[0] = 10.05
    assert watch({0, 1}) is None and len(reads) == 3  # no answer for it yet, nor the stale one
    broken = colocation.IdleWatch(read=lambda: (_ for _ in ()).throw(OSError("no /proc")))
    assert broken({0, 1}) is None and broken({0, 1}) is None


def test_the_idle_watch_never_answers_where_proc_stat_renumbers_the_cpus():
    """A container's LXCFS lists its CPUs as cpu0, cpu1, ... whatever the affinity mask's numbers: the idle shares
    of `cpu1` there are not CPU 1's, so a mask of CPUs 4 and 5 gets no answer, now or later."""
    now, reads = [0.0], []
    stat = STAT.replace(b"{}", b"100")
    watch = colocation.IdleWatch(read=lambda: (reads.append(1), stat)[1], clock=lambda: now[0])
    assert watch({4, 5}) is None and watch.renumbered
    now[0] = 0.3
    assert watch({4, 5}) is None and watch({0, 1}) is None and len(reads) == 1  # for good, without reading
    only_some = colocation.IdleWatch(read=lambda: STAT.replace(b"{}", b"100"), clock=lambda: now[0])
    assert only_some({0, 1, 2}) is None and only_some.renumbered  # a mask CPU /proc/stat does not list


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="no /proc/stat on this host")
def test_a_real_idle_watch_reads_this_hosts_cpus():
    watch = colocation.IdleWatch()
    allowed = set(os.sched_getaffinity(0))
    assert watch(allowed) is None
    busy_until = time.monotonic() + colocation.WINDOW_MIN_S * 1.5
    while time.monotonic() < busy_until:  # this thread keeps one CPU busy for the window
        pass
    idle = watch(allowed)
    assert idle is not None and idle <= allowed and not watch.renumbered
