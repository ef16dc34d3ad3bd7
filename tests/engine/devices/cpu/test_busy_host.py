"""busy_host.py: Intel's OpenMP threads spin through a request only while the host is calm."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from engine.devices.cpu import busy_host
from engine.devices.cpu.busy_host import CALM_RUNS, SpinGuard, busy, next_calm


@pytest.fixture(autouse=True)
def every_run_measured(monkeypatch, request):
    """The tests' runs last microseconds: every one is measured unless a test is about the short runs."""
    if "short" not in request.node.name:
        monkeypatch.setattr(busy_host, "SHORT_RUN_S", 0.0)


def test_after_a_short_run_a_run_is_measured_at_random_one_in_short_every(monkeypatch):
    """After a run under SHORT_RUN_S a run is measured when the draw falls under 1 / SHORT_EVERY (begin gives None
    otherwise, end does nothing, the calm count stays); a measured run that is long again measures every run."""
    now, reads, draws = [0.0], [], iter([0.5, 0.99, 0.2, 0.1, 0.9])
    monkeypatch.setattr(busy_host.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(busy_host, "_random", lambda: next(draws))
    monkeypatch.setattr(busy_host.resource, "getrusage",
                        lambda who: (reads.append(1), type("R", (), {"ru_nivcsw": 0})())[1])
    guard = SpinGuard(lambda t: None, lambda: 20_000)
    guard.calm = 3

    def run(seconds: float) -> bool:
        started = guard.begin()
        now[0] += seconds
        guard.end(started)
        return started is not None

    assert run(1e-5)  # the first is measured (no draw): short from now on
    assert [run(1e-5) for _ in range(4)] == [False, False, False, True]  # draws 0.5, 0.99, 0.2, then 0.1 < 1 / 8
    assert guard.calm == 5 and len(reads) == 4  # only the measured runs counted
    assert not run(0.01)  # draw 0.9: a long run unmeasured keeps the short state
    monkeypatch.setattr(busy_host, "_random", lambda: 0.0)
    assert run(0.01)  # measured, long: every one after it
    monkeypatch.setattr(busy_host, "_random", lambda: pytest.fail("no draw after a long run"))
    assert run(0.01) and run(0.01)


def test_a_short_and_a_long_model_in_turn_leave_the_long_one_measured(monkeypatch):
    """The state is the process's: a short graph and a long busy one in strict turns (a preprocessing model
    before the main one on every request) must still turn spinning off, which a counter in step with the turns
    never did (the draws seeded: the same sequence every run)."""
    guard = SpinGuard(lambda t: None, lambda: 20_000)
    clock, switches = [0.0], [0]
    monkeypatch.setattr(busy_host, "_random", random.Random(7).random)
    monkeypatch.setattr(busy_host.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(busy_host.resource, "getrusage", lambda who: type("R", (), {"ru_nivcsw": switches[0]})())
    for k in range(400):
        short = k % 2 == 0
        started = guard.begin()
        clock[0] += 1e-5 if short else 0.02
        switches[0] += 0 if short else 100
        guard.end(started)
    assert guard.target() == 0 and guard.calm < CALM_RUNS


def test_a_run_is_busy_past_a_few_preemptions_plus_one_per_tick():
    # calm runs measured 0-5 involuntary switches at 6-17 ms; busy ones 7-250
    assert not busy(0, 0.006) and not busy(5, 0.017) and not busy(busy_host.BUSY_FLOOR, 0.0)
    assert busy(busy_host.BUSY_FLOOR + 1, 0.0) and busy(20, 0.015) and busy(222, 0.4)
    assert not busy(60, 0.250)  # a long calm run (250 ms: up to 62 ticks) is not busy by its length alone


def test_one_busy_run_stops_the_spin_and_calm_runs_in_a_row_bring_it_back():
    calm = CALM_RUNS
    calm = next_calm(calm, True)
    assert calm == 0
    for k in range(1, CALM_RUNS):
        calm = next_calm(calm, False)
        assert calm == k
        if k == CALM_RUNS // 2:
            assert next_calm(calm, True) == 0  # one busy run starts the count again
    assert next_calm(next_calm(calm, False), False) == CALM_RUNS  # capped


def test_the_guard_sets_each_threads_blocktime_when_the_state_changes(monkeypatch):
    calls = []
    guard = SpinGuard(calls.append, lambda: 20_000)  # the runtime's spinning value, in its own unit
    switches = iter([0, 0, 10, 500, 500])  # a calm run, a busy one, and the next one's start
    monkeypatch.setattr(busy_host.resource, "getrusage",
                        lambda who: type("R", (), {"ru_nivcsw": next(switches)})())
    guard.end(guard.begin())
    guard.end(guard.begin())
    assert calls == [20_000] and guard.calm == 0 and guard.target() == 0  # set once; unchanged state, no call
    guard.calm = CALM_RUNS - 1
    guard.begin()
    assert calls == [20_000, 0]  # the busy state reaches the thread at its next run


PREEMPTED = """
import os, resource, subprocess, sys, time
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one CPU, shared with the loops below (they inherit it)
loop = "import time\\nend = time.monotonic() + 3\\nwhile time.monotonic() < end:\\n    pass"
loops = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(2)]
time.sleep(0.1)
before = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
end = time.perf_counter() + 0.3
while time.perf_counter() < end:
    pass
print(resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - before)
for p in loops:
    p.kill()
    p.wait()
"""


def test_the_kernel_counts_the_preemptions_the_guard_reads():
    """The signal the guard reads is real: a thread spinning on a CPU shared with two busy processes (pinned
    there, each ending by itself within 3 s) is preempted, and getrusage counts it."""
    done = subprocess.run([sys.executable, "-c", PREEMPTED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 0


def test_a_busy_looking_run_the_host_had_room_for_counts_as_calm(monkeypatch):
    """Before a run counts as busy the guard asks whether the host had room for it (colocation.py: the run queue):
    when it had, the run's switches were the team's own and spinning stays on; otherwise busy."""
    moved = [True]
    asked = []
    guard = SpinGuard(lambda t: None, lambda: 20_000, spread=lambda: (asked.append(1), moved[0])[1])
    switches = iter([0, 50, 0, 50, 0, 1])  # busy, busy, calm
    monkeypatch.setattr(busy_host.resource, "getrusage",
                        lambda who: type("R", (), {"ru_nivcsw": next(switches)})())
    guard.end(guard.begin())
    assert len(asked) == 1 and guard.calm == CALM_RUNS and guard.target() == 20_000
    moved[0] = False
    guard.end(guard.begin())
    assert len(asked) == 2 and guard.calm == 0
    guard.end(guard.begin())
    assert len(asked) == 2 and guard.calm == 1  # a calm run asks nothing


def test_a_spread_that_fails_leaves_the_run_alone_and_counts_it_busy(monkeypatch, caplog):
    def broken():
        raise OSError("no /proc here")

    guard = SpinGuard(lambda t: None, lambda: 20_000, spread=broken)
    switches = iter([0, 50, 0, 50])
    monkeypatch.setattr(busy_host.resource, "getrusage",
                        lambda who: type("R", (), {"ru_nivcsw": next(switches)})())
    with caplog.at_level("WARNING", logger="engine.devices.cpu"):
        guard.end(guard.begin())
        guard.end(guard.begin())
    assert guard.calm == 0
    assert sum("team's CPUs failed" in r.getMessage() for r in caplog.records) == 1  # said once
