"""Keep-warm threads (engine/devices/cpu/warm_cpus.py): idle priority, awake exactly while runs are in progress,
asleep otherwise, stopped on close; the setting's choices. No timing: states are read from /proc and waited for
with a generous deadline, so a loaded machine (where an idle-priority thread gets almost no CPU) only slows them."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from engine.devices.cpu import threads
from engine.devices.cpu.loops.warm import SUPPORTED
from engine.devices.cpu.options import CpuOptions, WaitPolicy
from engine.devices.cpu.warm_cpus import WarmCpus, wanted

needs_futex = pytest.mark.skipif(not SUPPORTED, reason="keep-warm threads need Linux on x86-64 or AArch64")
DEADLINE_S = 60.0


def _state(thread) -> str:
    """The thread's scheduler state letter from /proc (R runnable or running, S sleeping, ...)."""
    stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def _wait_for_state(thread, want: str) -> None:
    end = time.monotonic() + DEADLINE_S
    seen = []
    while time.monotonic() < end:
        seen.append(_state(thread))
        # a spinner is R; a sleeper is S; a preempted spinner is still R, so R twice in a row over a 10 ms span
        # means awake, and S twice means asleep in the futex
        if seen[-2:] == [want, want]:
            return
        time.sleep(0.01)
    raise AssertionError(f"thread never reached {want!r}: last states {seen[-10:]}")


@pytest.mark.parametrize("setting, threads_, quota, want", [
    ("auto", 2, None, SUPPORTED), ("auto", 8, None, SUPPORTED),
    ("auto", 1, None, False),  # one thread hands nothing over
    ("auto", 2, 2, False),  # a CPU quota: spinning would spend it
    ("1", 2, 2, SUPPORTED), ("0", 2, None, False), ("0", 1, 4, False),
])
def test_wanted_by_setting_threads_and_quota(setting, threads_, quota, want):
    assert wanted(setting, threads_, quota) is want


@pytest.mark.skipif(SUPPORTED, reason="only where the platform has no futex")
def test_asked_for_where_unsupported_is_an_error():
    with pytest.raises(ValueError, match="NNSERVE_KEEP_WARM=1"):
        wanted("1", 2, None)


def test_setting_read_from_the_environment():
    assert CpuOptions.from_env({}).keep_warm == "auto"
    assert CpuOptions.from_env({"NNSERVE_KEEP_WARM": " 0 "}).wait_policy.keep_warm == "0"
    with pytest.raises(ValueError, match="NNSERVE_KEEP_WARM='yes'"):
        CpuOptions.from_env({"NNSERVE_KEEP_WARM": "yes"})


@needs_futex
def test_idle_priority_awake_during_runs_asleep_after_and_stopped_on_close():
    warm = WarmCpus(2, grace_polls=1000)
    try:
        for t in warm.threads:
            assert os.sched_getscheduler(t.native_id) == os.SCHED_IDLE
            _wait_for_state(t, "S")  # no run: asleep in the futex
        for _ in range(2):  # twice: a second run wakes them again
            warm.set_runs(1)
            warm.set_runs(2)  # a second concurrent run: still awake
            for t in warm.threads:
                _wait_for_state(t, "R")
            warm.set_runs(1)
            for t in warm.threads:
                _wait_for_state(t, "R")
            warm.set_runs(0)
            for t in warm.threads:
                _wait_for_state(t, "S")
    finally:
        warm.close()
    for t in warm.threads:
        t.join(DEADLINE_S)
        assert not t.is_alive()


@needs_futex
def test_runs_keep_the_pools_cpus_warm_and_a_new_count_resizes(monkeypatch):
    """threads.running() drives them: one per CPU of the pool; a new thread count replaces them, and the new ones
    start from the runs in progress."""
    monkeypatch.setattr(threads, "cgroup_cpus", lambda: None)
    before = threads.get_threads()
    monkeypatch.setattr(threads, "_policy", WaitPolicy(keep_warm="1"))
    try:
        threads.set_threads(2)
        threads._sync_warm()
        first = threads._warm
        assert first is not None and len(first.threads) == 2
        with threads.running():
            assert first.word[0] == 1
            threads.set_threads(3)  # mid-run
            second = threads._warm
            assert second is not first and len(second.threads) == 3
            assert second.word[0] == 1
            for t in second.threads:
                _wait_for_state(t, "R")
        assert second.word[0] == 0
        for t in first.threads:
            t.join(DEADLINE_S)
            assert not t.is_alive()  # the replaced ones stopped
    finally:
        monkeypatch.setattr(threads, "_policy", WaitPolicy(keep_warm="0"))
        threads._sync_warm()
        threads.set_threads(before)
    assert threads._warm is None
