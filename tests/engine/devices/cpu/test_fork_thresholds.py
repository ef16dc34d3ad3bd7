"""The split thresholds from the host's hand-over cost (threads.fork_thresholds, measure_handover, configure):
the pure rule with given costs, the statistic on a fake clock, and configure applying an injected cost. No test
depends on how fast this machine is."""

from __future__ import annotations

import pytest

from engine.devices.cpu import threads as T
from engine.devices.cpu.onednn import binding
from engine.devices.cpu.options import CpuOptions, WaitPolicy

RESNET18_CONV = 56 * 56 * 64 * 64 * 9  # a 3x3 conv of ResNet-18 at batch 1: 115.6M multiply-adds


@pytest.fixture
def state(monkeypatch):
    """The module's threshold state, restored after the test, not yet configured; two threads."""
    for name in ("FORK_WORK", "MIN_WORK", "_handover", "_thresholds_configured", "_onednn_pending",
                 "_kernels_pending", "_configured", "_spin_configured"):
        monkeypatch.setattr(T, name, getattr(T, name))
    monkeypatch.setattr(T, "_thresholds_configured", False)  # as in a new process: the next configure sets them
    before = T.get_threads()
    T.set_threads(2)
    yield T
    T.set_threads(before)


def test_no_cost_keeps_the_floors():
    for cost in (T.HandOver(), T.HandOver(0, 0)):
        assert T.fork_thresholds(cost, 2) == (T.FORK_WORK_FLOOR, T.MIN_WORK_FLOOR)
    assert T.fork_thresholds(T.HandOver(80, 80), 1) == (T.FORK_WORK_FLOOR, T.MIN_WORK_FLOOR)  # nothing to split


def test_the_threshold_is_where_the_split_saves_what_the_hand_over_costs():
    """Two threads save 1 - 1/(2 * SPLIT_EFFICIENCY) of the one-thread time; a real op's hand-over costs
    OP_HANDOVER_FACTOR no-op ones."""
    cost = 20.0
    work = T.split_threshold(cost, T.DENSE_MACS_PER_US, 2, 1, 1 << 40)
    saved_us = work / T.DENSE_MACS_PER_US * (1 - 1 / (2 * T.SPLIT_EFFICIENCY))
    assert saved_us == pytest.approx(T.OP_HANDOVER_FACTOR * cost, rel=1e-6)
    # more threads save more of the time: the split pays from less work
    assert T.split_threshold(cost, T.DENSE_MACS_PER_US, 4, 1, 1 << 40) < work


def test_thresholds_grow_with_the_cost_between_floor_and_ceiling():
    costs = [1, 5, 10, 20, 40, 80, 160, 1000, 1e6]
    pairs = [T.fork_thresholds(T.HandOver(c, c), 2) for c in costs]
    for (f0, m0), (f1, m1) in zip(pairs, pairs[1:], strict=False):
        assert f0 <= f1 and m0 <= m1
    assert pairs[0] == (T.FORK_WORK_FLOOR, T.MIN_WORK_FLOOR)  # bare metal: a few microseconds
    assert pairs[-1] == (T.FORK_WORK_CEILING, T.MIN_WORK_CEILING)
    assert T.FORK_WORK_FLOOR < T.fork_thresholds(T.HandOver(30, 30), 2)[0] < T.FORK_WORK_CEILING  # a VM's wake-up


def test_a_big_conv_always_forks(state):
    """Whatever the hand-over costs, ResNet-18's convs run on every thread."""
    state.set_handover(T.HandOver(1e6, 1e6))
    assert T.FORK_WORK == T.FORK_WORK_CEILING and T.threads_for(RESNET18_CONV) == 2
    assert T.threads_for(T.FORK_WORK_CEILING - 1) == 1


def test_the_costs_set_their_own_thresholds():
    """oneDNN's team sets FORK_WORK, our kernels' pool MIN_WORK."""
    fork, least = T.fork_thresholds(T.HandOver(onednn_us=50), 2)
    assert fork > T.FORK_WORK_FLOOR and least == T.MIN_WORK_FLOOR
    fork, least = T.fork_thresholds(T.HandOver(kernels_us=50), 2)
    assert fork == T.FORK_WORK_FLOOR and least > T.MIN_WORK_FLOOR


def test_measure_handover_takes_the_upper_quartile(monkeypatch):
    """On a fake clock: the gap is waited on the clock, the forks' own times make the statistic, a preemption
    (one huge sample) does not move it, and a fork that ran nothing (False) is not counted."""
    clock = [0]
    monkeypatch.setattr(T.time, "perf_counter_ns", lambda: clock.__setitem__(0, clock[0] + 100) or clock[0])
    durations = iter([0] + [10_000] * 17 + [20_000] * 6 + [50_000_000])  # warm-up, then 24 samples, in ns

    def fork():
        clock[0] += next(durations)
    assert T.measure_handover(fork, samples=24, gap_us=3) == pytest.approx(20.1)  # 20 us + one clock read
    assert T.measure_handover(lambda: False, samples=5) == 0.0


def test_configure_applies_a_given_cost(state):
    state.configure(None, WaitPolicy(fork_us=40))
    assert T.get_handover() == T.HandOver(40, 40)
    assert (T.FORK_WORK, T.MIN_WORK) == T.fork_thresholds(T.HandOver(40, 40), 2)
    assert not T._onednn_pending and not T._kernels_pending  # nothing measured
    state.configure(None, WaitPolicy(fork_us=0))  # only the first instance sets them
    assert T.get_handover() == T.HandOver(40, 40)


def test_fork_us_zero_keeps_todays_floors(state):
    state.configure(None, WaitPolicy(fork_us=0))
    assert (T.FORK_WORK, T.MIN_WORK) == (T.FORK_WORK_FLOOR, T.MIN_WORK_FLOOR)


def test_configure_measures_once_on_first_use(state, monkeypatch):
    """Unset, each cost is measured when first needed (a primitive created, a kernel split), once, and the
    thresholds follow it: the measurement is injected."""
    measured = []

    def fake(fork, *args, **kwargs):
        measured.append(fork)
        return 60.0 if fork is T._fork_openmp else 90.0
    monkeypatch.setattr(T, "measure_handover", fake)
    monkeypatch.setattr(T, "_openmp", T._openmp or object())  # oneDNN's team is known (never run: faked)
    state.configure(None, WaitPolicy())
    assert T._onednn_pending and T._kernels_pending
    assert (T.FORK_WORK, T.MIN_WORK) == (T.FORK_WORK_FLOOR, T.MIN_WORK_FLOOR)  # nothing measured yet
    fork, least = T.fork_thresholds(T.HandOver(60.0, 90.0), 2)
    assert T.threads_for(fork - 1) == 1 and T.threads_for(fork) == 2
    assert T.FORK_WORK == fork and T.MIN_WORK == T.MIN_WORK_FLOOR
    assert T.chunks_for(8, least - 1) == 1 and T.chunks_for(8, least) == 2
    assert T.get_handover() == T.HandOver(60.0, 90.0) and (T.FORK_WORK, T.MIN_WORK) == (fork, least)
    T.threads_for(1)
    T.chunks_for(8, 1)
    assert measured == [T._fork_openmp, T._fork_kernels_pool]


def test_one_thread_measures_nothing(state, monkeypatch):
    monkeypatch.setattr(T, "measure_handover", lambda *a, **k: pytest.fail("measured on one thread"))
    T.set_threads(1)
    state.configure(None, WaitPolicy())
    assert T.threads_for(RESNET18_CONV) == 1 and T.chunks_for(8, 1 << 30) == 1


def test_the_real_forks_run(state):
    """The no-op forks the measurement times run on this machine's pools (their times are not checked)."""
    assert T.measure_handover(T._fork_kernels_pool, samples=3, gap_us=1) > 0
    if binding.load() is not None and T._openmp is not None:
        assert T.measure_handover(T._fork_openmp, samples=3, gap_us=1) > 0


@pytest.mark.parametrize("value, want", [("", None), ("0", 0), (" 35 ", 35), ("1000000", 1_000_000)])
def test_nnserve_fork_us(value, want):
    options = CpuOptions.from_env({"NNSERVE_FORK_US": value})
    assert options.fork_us == want and options.wait_policy.fork_us == want


@pytest.mark.parametrize("value", ["-1", "2.5", "fast", "1000001", "٣"])
def test_nnserve_fork_us_rejects(value):
    with pytest.raises(ValueError, match="NNSERVE_FORK_US"):
        CpuOptions.from_env({"NNSERVE_FORK_US": value})
