"""Properties of the batching decision over random queues, configs and times (hypothesis), and a fake-clock
simulation that drives decide() the way the scheduler does."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.scheduling.config import SchedulerConfig
from server.scheduling.policy import Pending, decide

KEYS = ("a", "b")


@st.composite
def configs(draw) -> SchedulerConfig:
    max_batch = draw(st.integers(0, 12))
    preferred = draw(st.sets(st.integers(1, max_batch), max_size=3)) if max_batch else set()
    levels = draw(st.integers(0, 3))
    return SchedulerConfig(
        max_batch_size=max_batch, preferred_batch_sizes=tuple(preferred),
        max_queue_delay_us=draw(st.sampled_from([0, 0, 1, 5, 50])),
        timeout_action=draw(st.sampled_from(["REJECT", "DELAY"])),
        priority_levels=levels, default_priority_level=levels and draw(st.integers(1, levels)),
        dynamic_batching=draw(st.booleans()) or max_batch == 0)


@st.composite
def queues(draw, cfg: SchedulerConfig) -> list[Pending]:
    n = draw(st.integers(0, 12))
    t, queue = 0, []
    for i in range(n):
        t += draw(st.integers(0, 20_000))
        timeout = draw(st.one_of(st.none(), st.integers(1, 60_000)))
        queue.append(Pending(
            req_id=i, rows=draw(st.integers(1, max(1, cfg.max_batch_size))),
            shape_key=draw(st.sampled_from(KEYS)), enqueue_ns=t,
            deadline_ns=None if timeout is None else t + timeout,
            priority=cfg.priority_of(draw(st.integers(0, cfg.priority_levels + 1)))))
    return queue


@st.composite
def scenarios(draw):
    cfg = draw(configs())
    queue = draw(queues(cfg))
    last = queue[-1].enqueue_ns if queue else 0
    return cfg, queue, last + draw(st.integers(0, 80_000)), draw(st.integers(0, 2))


def served_order(queue, now, cfg):
    """Independent statement of who goes first: level, then unexpired before DELAY-expired, then arrival."""
    def expired(p):
        return p.deadline_ns is not None and now >= p.deadline_ns
    live = [p for p in queue if cfg.timeout_action == "DELAY" or not expired(p)]
    return sorted(live, key=lambda p: (p.priority, cfg.timeout_action == "DELAY" and expired(p), p.enqueue_ns))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_decision_invariants(scenario):
    cfg, queue, now, free = scenario
    d = decide(queue, now, cfg, free_instances=free)
    by_id = {p.req_id: p for p in queue}
    chosen = [by_id[i] for i in d.batch]
    order = served_order(queue, now, cfg)
    rank = {p.req_id: r for r, p in enumerate(order)}

    # expiry: exactly the passed deadlines under REJECT, never under DELAY, never also dispatched
    want_expired = {p.req_id for p in queue if p.deadline_ns is not None and now >= p.deadline_ns}
    assert set(d.expired) == (want_expired if cfg.timeout_action == "REJECT" else set())
    assert not set(d.expired) & set(d.batch)

    if not chosen:
        # never stalls: with work and a free instance there is always a time to look again
        if order and free:
            assert d.wait_until_ns is not None and d.wait_until_ns > now
        return
    assert free > 0
    assert chosen[0] is order[0], "the first request in service order is never passed over"
    assert [rank[p.req_id] for p in chosen] == sorted(rank[p.req_id] for p in chosen)
    assert len({p.shape_key for p in chosen}) == 1
    total = sum(p.rows for p in chosen)
    if not cfg.batches:
        assert len(chosen) == 1
        return
    assert total <= cfg.max_batch_size
    delay_left = min(p.enqueue_ns for p in chosen) + cfg.max_queue_delay_us * 1000 > now
    if delay_left and total not in cfg.preferred_batch_sizes:
        # left before the delay without a preferred size: only because it could not grow
        rest = [p for p in order[rank[chosen[-1].req_id] + 1:] if p.shape_key == chosen[0].shape_key]
        assert total == cfg.max_batch_size or (rest and total + rest[0].rows > cfg.max_batch_size)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_waiting_respects_the_delay(scenario):
    cfg, queue, now, free = scenario
    d = decide(queue, now, cfg, free_instances=max(free, 1))
    order = served_order(queue, now, cfg)
    if d.batch or not order:
        return
    assert cfg.batches and cfg.max_queue_delay_us > 0
    assert d.wait_until_ns <= order[0].enqueue_ns + cfg.max_queue_delay_us * 1000
    assert sum(p.rows for p in queue if p.shape_key == order[0].shape_key and p in order) < cfg.max_batch_size


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def advance_to(self, t: int) -> None:
        assert t >= self.now
        self.now = t


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_simulation_serves_everyone_within_the_delay(data):
    """Instant instances, no deadlines: every request is dispatched, each batch within max_batch_size, and no
    request of the top priority level waits longer than max_queue_delay."""
    cfg = data.draw(configs())
    arrivals = data.draw(queues(cfg))
    arrivals = [Pending(p.req_id, p.rows, p.shape_key, p.enqueue_ns, None, p.priority) for p in arrivals]
    clock, queue, dispatched_at = FakeClock(), [], {}
    upcoming = list(arrivals)
    while upcoming or queue:
        while upcoming and upcoming[0].enqueue_ns <= clock.now:
            queue.append(upcoming.pop(0))
        while True:
            d = decide(queue, clock.now, cfg, free_instances=1)
            if not d.batch:
                break
            assert sum(p.rows for p in queue if p.req_id in d.batch) <= max(cfg.max_batch_size, 1)
            dispatched_at.update({i: clock.now for i in d.batch})
            queue = [p for p in queue if p.req_id not in d.batch]
        wake = [t for t in (d.wait_until_ns, upcoming[0].enqueue_ns if upcoming else None) if t is not None]
        if not wake:
            assert not queue, "requests left with nothing to wake the scheduler"
            break
        clock.advance_to(min(wake))
    assert set(dispatched_at) == {p.req_id for p in arrivals}
    delay_ns = cfg.max_queue_delay_us * 1000 if cfg.batches else 0
    for p in arrivals:
        # A lower level waits behind whatever a higher level is doing: the bound holds for the top level (or one).
        if p.priority <= 1:
            assert dispatched_at[p.req_id] - p.enqueue_ns <= delay_ns
