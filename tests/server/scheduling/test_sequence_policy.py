"""The sequence batcher's pure decisions (server/scheduling/sequence_policy.py): slots, backlog, batches per
instance for the direct and oldest strategies, delays and idle release, on synthetic sequences and a given clock."""

from __future__ import annotations

import pytest

from server.scheduling.sequence_policy import (
    DIRECT,
    OLDEST,
    SequencePolicy,
    SequenceView,
    bind,
    choose,
    idle,
    plan,
)

MS = 1_000_000


def seq(key: str, slot: int | None, head_ns: int | None = 0, last_ns: int = 0, running: bool = False) -> SequenceView:
    return SequenceView(key, slot, head_ns, last_ns, running)


def test_backlog_takes_free_slots_oldest_first_spread_over_instances() -> None:
    policy = SequencePolicy(DIRECT, max_batch_size=2, slots_per_instance=2)
    seqs = [seq("a", 0), seq("b", None, head_ns=30), seq("c", None, head_ns=10), seq("d", None, head_ns=20),
            seq("e", None, head_ns=40)]
    # instance 0 holds a; c (oldest) goes to instance 1, d to instance 0 (1 each then, lowest slot), b to 1
    assert bind(seqs, policy, num_instances=2) == [("c", 2), ("d", 1), ("b", 3)]


def test_backlog_without_a_waiting_request_takes_no_slot() -> None:
    policy = SequencePolicy(DIRECT, max_batch_size=1, slots_per_instance=1)
    assert bind([seq("a", None, head_ns=None)], policy, num_instances=1) == []


def test_direct_runs_ready_sequences_in_slot_order_one_request_each() -> None:
    policy = SequencePolicy(DIRECT, max_batch_size=4, slots_per_instance=4)
    seqs = [seq("late", 3, head_ns=1), seq("early", 1, head_ns=50), seq("idle", 2, head_ns=None),
            seq("other", 4, head_ns=0)]  # slot 4 is instance 1's
    assert choose(seqs, 0, 100, policy) == (("early", "late"), None)
    assert choose(seqs, 1, 100, policy) == (("other",), None)


def test_oldest_runs_the_oldest_requests_up_to_max_batch_size() -> None:
    policy = SequencePolicy(OLDEST, max_batch_size=2, slots_per_instance=4)
    seqs = [seq("a", 0, head_ns=30), seq("b", 1, head_ns=10), seq("c", 2, head_ns=20), seq("d", 3, head_ns=None)]
    assert choose(seqs, 0, 100, policy) == (("b", "c"), None)


def test_a_model_without_batching_runs_one_request_per_execution() -> None:
    policy = SequencePolicy(OLDEST, max_batch_size=0, slots_per_instance=3)
    seqs = [seq("a", 0, head_ns=30), seq("b", 1, head_ns=10)]
    assert choose(seqs, 0, 100, policy) == (("b",), None)


def test_oldest_delay_waits_for_a_preferred_size_or_the_delay() -> None:
    policy = SequencePolicy(OLDEST, max_batch_size=4, slots_per_instance=4, max_queue_delay_ns=5 * MS,
                            preferred_batch_sizes=(2,))
    one = [seq("a", 0, head_ns=0), seq("b", 1, head_ns=None)]
    assert choose(one, 0, 1 * MS, policy) == ((), 5 * MS)
    assert choose(one, 0, 5 * MS, policy) == (("a",), None)
    two = [seq("a", 0, head_ns=0), seq("b", 1, head_ns=MS)]
    assert choose(two, 0, 2 * MS, policy) == (("a", "b"), None)


def test_direct_delay_ends_when_every_sequence_of_the_instance_is_ready() -> None:
    policy = SequencePolicy(DIRECT, max_batch_size=4, slots_per_instance=4, max_queue_delay_ns=5 * MS)
    assert choose([seq("a", 0), seq("b", 1, head_ns=None)], 0, MS, policy) == ((), 5 * MS)
    assert choose([seq("a", 0), seq("b", 1, head_ns=0)], 0, MS, policy) == (("a", "b"), None)
    utilization = SequencePolicy(DIRECT, max_batch_size=4, slots_per_instance=4, max_queue_delay_ns=5 * MS,
                                 minimum_slot_utilization=0.25)
    assert choose([seq("a", 0), seq("b", 1, head_ns=None)], 0, MS, utilization) == (("a",), None)


def test_idle_sequences_are_released_and_the_next_release_is_the_wake_up() -> None:
    policy = SequencePolicy(DIRECT, max_batch_size=1, slots_per_instance=1, idle_ns=10 * MS)
    seqs = [seq("quiet", 0, head_ns=None, last_ns=0), seq("busy", 1, head_ns=None, last_ns=0, running=True),
            seq("queued", 2, head_ns=0, last_ns=0), seq("recent", 3, head_ns=None, last_ns=5 * MS)]
    assert idle(seqs, 10 * MS, policy) == ["quiet"]
    decision = plan(seqs, 10 * MS, policy, num_instances=4, free_instances=frozenset())
    assert decision.released == ("quiet",)
    assert decision.wait_until_ns == 15 * MS


def test_plan_releases_then_binds_the_backlog_then_runs() -> None:
    policy = SequencePolicy(DIRECT, max_batch_size=1, slots_per_instance=1, idle_ns=10 * MS)
    seqs = [seq("gone", 0, head_ns=None, last_ns=0), seq("waiting", None, head_ns=3 * MS, last_ns=3 * MS)]
    decision = plan(seqs, 20 * MS, policy, num_instances=1, free_instances=frozenset({0}))
    assert decision.released == ("gone",)
    assert decision.bound == (("waiting", 0),)
    assert decision.batches == ((0, ("waiting",)),)


def test_busy_instances_run_nothing() -> None:
    policy = SequencePolicy(DIRECT, max_batch_size=2, slots_per_instance=2)
    decision = plan([seq("a", 0)], 0, policy, num_instances=1, free_instances=frozenset())
    assert decision.batches == ()


def test_knobs_are_checked() -> None:
    with pytest.raises(ValueError, match="strategy"):
        SequencePolicy("newest")
    with pytest.raises(ValueError, match="slots per instance"):
        SequencePolicy(DIRECT, slots_per_instance=0)
