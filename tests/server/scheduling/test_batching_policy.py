"""The batching decision on synthetic queues with a fake clock: no server, no threads, no sleeping."""

from __future__ import annotations

import pytest

from server.scheduling.config import SchedulerConfig
from server.scheduling.policy import Decision, Pending, decide

US = 1000  # ns per microsecond
A, B = ("x", (3, 8, 8), "f4"), ("x", (3, 4, 4), "f4")  # two shape keys


def make_cfg(max_batch: int = 8, preferred: tuple[int, ...] = (), delay_us: int = 0, **kw) -> SchedulerConfig:
    return SchedulerConfig(max_batch_size=max_batch, preferred_batch_sizes=preferred, max_queue_delay_us=delay_us, **kw)


def make_queue(*sizes: int, key=A, t0: int = 0, step_ns: int = 10) -> list[Pending]:
    """Requests 0..n-1 with the given batch sizes, arriving step_ns apart from t0."""
    return [Pending(req_id=i, rows=s, shape_key=key, enqueue_ns=t0 + i * step_ns) for i, s in enumerate(sizes)]


def run(queue: list[Pending], now: int, cfg: SchedulerConfig, free: int = 1) -> Decision:
    return decide(queue, now, cfg, free_instances=free)


def test_empty_queue_waits_for_arrivals():
    assert run([], 0, make_cfg()) == Decision()


def test_no_delay_dispatches_everything_queued_at_once():
    d = run(make_queue(1, 1, 1), 100, make_cfg(max_batch=8))
    assert d.batch == (0, 1, 2) and d.wait_until_ns is None


def test_batch_never_exceeds_max_and_keeps_order():
    d = run(make_queue(3, 3, 3, 1), 100, make_cfg(max_batch=8))
    assert d.batch == (0, 1)  # 3 + 3; the third would make 9; the 1 behind it must not overtake


def test_request_with_own_batch_counts_that_many():
    d = run(make_queue(4, 4, 1), 100, make_cfg(max_batch=8))
    assert d.batch == (0, 1)


def test_only_equal_shapes_merge_and_head_decides_the_shape():
    q = make_queue(1, 1, 1, 1)
    q[1] = Pending(1, 1, B, 10)
    q[3] = Pending(3, 1, B, 30)
    assert run(q, 100, make_cfg()).batch == (0, 2)
    assert run(q[1:], 100, make_cfg()).batch == (1, 3)


def test_delay_waits_until_oldest_plus_delay():
    cfg = make_cfg(max_batch=8, delay_us=500)
    q = make_queue(1, 1, t0=1000)
    d = run(q, 1000 + 100 * US, cfg)
    assert d.batch == () and d.wait_until_ns == 1000 + 500 * US
    d = run(q, 1000 + 500 * US, cfg)
    assert d.batch == (0, 1)


def test_delay_ends_early_when_max_batch_reached():
    cfg = make_cfg(max_batch=4, delay_us=500)
    assert run(make_queue(1, 1, 1, 1, 1), 50, cfg).batch == (0, 1, 2, 3)
    assert run(make_queue(3, 2), 50, cfg).batch == (0,)  # 3 + 2 > 4: cannot grow, go now


def test_preferred_size_dispatches_before_delay():
    cfg = make_cfg(max_batch=8, preferred=(2, 4), delay_us=1000)
    assert run(make_queue(1, 1, 1), 50, cfg).batch == (0, 1)
    assert run(make_queue(1, 1, 1, 1, 1), 50, cfg).batch == (0, 1, 2, 3)  # the largest reachable
    assert run(make_queue(1), 50, cfg).wait_until_ns == 1000 * US


def test_preferred_size_with_no_delay_takes_largest_preferred_prefix():
    cfg = make_cfg(max_batch=8, preferred=(4,))
    assert run(make_queue(2, 2, 2), 50, cfg).batch == (0, 1)
    assert run(make_queue(1, 1, 1), 50, cfg).batch == (0, 1, 2)  # 4 unreachable: send what is there


def test_after_delay_everything_goes_even_past_preferred():
    cfg = make_cfg(max_batch=8, preferred=(2,), delay_us=10)
    assert run(make_queue(1, 1, 1), 10 * US + 1, cfg).batch == (0, 1, 2)


def test_no_free_instance_means_no_batch():
    d = run(make_queue(1, 1), 100, make_cfg(), free=0)
    assert d.batch == () and d.wait_until_ns is None


@pytest.mark.parametrize("cfg", [SchedulerConfig(max_batch_size=0),
                                 SchedulerConfig(max_batch_size=8, dynamic_batching=False)])
def test_unbatched_models_run_each_request_alone(cfg):
    assert run(make_queue(1, 1, 1), 100, cfg).batch == (0,)


def test_reject_expires_passed_deadlines_and_wakes_for_the_next():
    q = [Pending(0, 1, A, 0, deadline_ns=100), Pending(1, 1, A, 10, deadline_ns=500), Pending(2, 1, A, 20)]
    cfg = make_cfg(delay_us=1)
    d = run(q, 100, cfg, free=0)
    assert d.expired == (0,) and d.batch == () and d.wait_until_ns == 500
    d = run(q, 100, cfg)
    assert d.expired == (0,) and d.wait_until_ns == 500  # 500 ns deadline comes before the 1 us delay
    d = run(q, 1020, cfg)  # request 2 arrived at 20 ns: its delay ends at 1020
    assert d.expired == (0, 1) and d.batch == (2,)


def test_delay_action_moves_expired_behind_unexpired():
    q = [Pending(0, 1, A, 0, deadline_ns=100), Pending(1, 1, A, 10)]
    cfg = make_cfg(max_batch=1, timeout_action="DELAY")
    assert run(q, 50, cfg).batch == (0,)
    d = run(q, 100, cfg)
    assert d.batch == (1,) and d.expired == ()
    assert run(q[:1], 100, cfg).batch == (0,)  # delayed, not dropped


def test_higher_priority_goes_first_then_arrival_order():
    q = [Pending(0, 1, A, 0, priority=2), Pending(1, 1, A, 10, priority=1), Pending(2, 1, A, 20, priority=1)]
    cfg = make_cfg(max_batch=2, priority_levels=2, default_priority_level=2)
    assert run(q, 100, cfg).batch == (1, 2)


def test_delay_counts_from_oldest_request_in_the_batch():
    q = [Pending(0, 1, A, 5000, priority=1), Pending(1, 1, A, 0, priority=2)]
    cfg = make_cfg(delay_us=10, priority_levels=2, default_priority_level=2)
    assert run(q, 100, cfg).wait_until_ns == 10 * US


def test_expected_rows_dispatch_a_batch_that_holds_them_without_waiting():
    """The adaptive wait: a lone client's request (1 row expected) goes at once despite the delay; with 4 rows
    expected, 3 queued still wait; a 4th arrival sends them."""
    cfg = make_cfg(max_batch=8, delay_us=50_000)
    assert decide(make_queue(1), 10, cfg, free_instances=1, expected_rows=1).batch == (0,)
    d = decide(make_queue(1, 1, 1), 100, cfg, free_instances=1, expected_rows=4)
    assert d.batch == () and d.wait_until_ns == 50_000 * US
    assert decide(make_queue(1, 1, 1, 1), 100, cfg, free_instances=1, expected_rows=4).batch == (0, 1, 2, 3)
    assert decide(make_queue(1, 3), 100, cfg, free_instances=1, expected_rows=4).batch == (0, 1)  # rows count


def test_expected_rows_never_delay_past_the_configured_wait_or_beyond_max_batch():
    cfg = make_cfg(max_batch=4, delay_us=500)
    q = make_queue(1, 1, t0=1000)
    assert decide(q, 1000 + 500 * US, cfg, free_instances=1, expected_rows=16).batch == (0, 1)  # delay over
    assert decide(make_queue(1, 1, 1, 1), 1000, cfg, free_instances=1, expected_rows=16).batch == (0, 1, 2, 3)
    assert decide(q, 1000, cfg, free_instances=0, expected_rows=1).batch == ()  # no idle instance


def test_no_expected_rows_is_tritons_wait():
    cfg = make_cfg(max_batch=8, delay_us=500)
    assert decide(make_queue(1), 10, cfg, free_instances=1, expected_rows=0).batch == ()
