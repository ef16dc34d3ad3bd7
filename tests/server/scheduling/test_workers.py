"""server/scheduling/workers.py: the schedulers' threads, which let their kernel threads go when idle."""

from __future__ import annotations

import threading
import time

import pytest

from server.scheduling.workers import Workers

WAIT = 60.0  # generous: an event that must come is waited for, never slept for


def test_calls_run_on_the_named_threads_with_results_and_errors():
    workers = Workers(2, "nnserve-test")
    try:
        names = [workers.submit(lambda: threading.current_thread().name).result(WAIT) for _ in range(4)]
        assert set(names) <= {"nnserve-test-0", "nnserve-test-1"}
        assert workers.submit(lambda a, b=0: a + b, 2, b=3).result(WAIT) == 5
        with pytest.raises(ZeroDivisionError):
            workers.submit(lambda: 1 / 0).result(WAIT)
        assert workers.submit(lambda: "still serving").result(WAIT) == "still serving"
    finally:
        workers.shutdown()


def test_calls_one_after_another_stay_on_one_worker_and_a_backlog_waits_for_any():
    """The worker idle last takes the next call: under light traffic the others stay idle (and let their kernel
    threads go); calls beyond the workers wait in order for the first one free."""
    workers = Workers(3, "nnserve-test")
    try:
        names = [workers.submit(lambda: threading.current_thread().name).result(WAIT) for _ in range(10)]
        assert names == ["nnserve-test-0"] * 10
        gate = threading.Event()
        busy = [workers.submit(gate.wait, WAIT) for _ in range(3)]
        order: list[int] = []
        waiting = [workers.submit(order.append, i) for i in range(5)]
        gate.set()
        assert all(f.result(WAIT) for f in busy)
        for f in waiting:
            f.result(WAIT)
        assert sorted(order) == list(range(5))
    finally:
        workers.shutdown()


def test_an_idle_worker_lets_go_once_per_idle_spell_on_its_own_thread():
    idled = []
    spell = threading.Event()

    def on_idle():
        idled.append(threading.current_thread().name)
        spell.set()

    workers = Workers(1, "nnserve-test", on_idle=on_idle, idle_s=0.01)
    try:
        assert not spell.wait(0.2) and idled == []  # nothing ran yet: nothing to let go
        for _ in range(2):
            spell.clear()
            workers.submit(lambda: None).result(WAIT)
            assert spell.wait(WAIT)
        # each spell let go once, on the worker; a worker that has let go waits without a timeout
        assert idled == ["nnserve-test-0"] * 2
    finally:
        workers.shutdown()
    assert idled == ["nnserve-test-0"] * 3  # and once more as it stopped


def test_a_worker_that_stops_lets_go_on_its_way_out():
    idled = []
    workers = Workers(2, "nnserve-test", on_idle=lambda: idled.append(threading.current_thread().name), idle_s=3600)
    workers.submit(lambda: None).result(WAIT)
    workers.shutdown(wait=True)
    assert sorted(idled) == ["nnserve-test-0", "nnserve-test-1"]
    with pytest.raises(RuntimeError):
        workers.submit(lambda: None)


def test_a_release_refused_for_now_is_tried_again_after_another_idle_spell():
    answers = [False, False, True]
    calls = []
    done = threading.Event()

    def on_idle():
        calls.append(threading.current_thread().name)
        if len(calls) == len(answers):
            done.set()
        return answers[min(len(calls), len(answers)) - 1]

    workers = Workers(1, "nnserve-test", on_idle=on_idle, idle_s=0.01)
    try:
        workers.submit(lambda: None).result(WAIT)
        assert done.wait(WAIT)
        time.sleep(0.2)  # room for a fourth call, which must not come
        assert len(calls) == 3  # True ended the spell: no further calls until the next job
    finally:
        workers.shutdown()


def test_a_failing_release_is_logged_and_the_worker_goes_on(caplog):
    def on_idle():
        raise OSError("no team")

    workers = Workers(1, "nnserve-test", on_idle=on_idle, idle_s=0.01)
    try:
        for _ in range(3):
            assert workers.submit(lambda: 1).result(WAIT) == 1
    finally:
        workers.shutdown()
    assert "kernel threads failed" in caplog.text


def test_queued_calls_are_cancelled_on_request():
    gate, started = threading.Event(), threading.Event()
    workers = Workers(1, "nnserve-test")
    first = workers.submit(lambda: (started.set(), gate.wait(WAIT))[1])
    assert started.wait(WAIT)  # the first call is running: only the queued ones can be cancelled
    queued = [workers.submit(lambda: None) for _ in range(3)]
    workers.shutdown(wait=False, cancel_futures=True)
    gate.set()
    workers.shutdown(wait=True)
    assert first.result(WAIT) is True
    assert all(f.cancelled() for f in queued)
