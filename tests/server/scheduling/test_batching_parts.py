"""The pieces under the scheduler: shape keys, batch dims, config normalisation, in-order release, split/concat."""

from __future__ import annotations

import numpy as np
import pytest

from server.backend import RunTimings
from server.errors import InferenceError, InvalidArgumentError
from server.scheduling.config import SchedulerConfig
from server.scheduling.execution import concat_inputs, run_batch, split_outputs
from server.scheduling.policy import Pending
from server.scheduling.queue import Entry, RequestQueue, ResponseOrder, rows_of, shape_key


def test_shape_key_ignores_batch_dim_but_not_dtype_or_names():
    a = {"x": np.zeros((1, 3, 4), np.float32), "ids": np.zeros((1, 6), np.int64)}
    b = {"ids": np.ones((5, 6), np.int64), "x": np.ones((5, 3, 4), np.float32)}
    assert shape_key(a, batched=True) == shape_key(b, batched=True)
    assert shape_key(a, batched=True) != shape_key({**a, "x": a["x"].astype(np.float64)}, batched=True)
    assert shape_key(a, batched=True) != shape_key({"y": a["x"], "ids": a["ids"]}, batched=True)
    assert shape_key(a, batched=False) != shape_key(b, batched=False)  # no batch dim: the whole shape counts


def test_rows_of_reads_dim_zero_and_rejects_disagreement():
    assert rows_of({"x": np.zeros((3, 2)), "y": np.zeros((3,))}, batched=True) == 3
    assert rows_of({"x": np.zeros((3, 2))}, batched=False) == 1
    with pytest.raises(InvalidArgumentError, match="batch dimension"):
        rows_of({"x": np.zeros((3, 2)), "y": np.zeros((2,))}, batched=True)
    with pytest.raises(InvalidArgumentError, match="batch dimension"):
        rows_of({"x": np.zeros(())}, batched=True)
    with pytest.raises(InvalidArgumentError, match="no inputs"):
        rows_of({}, batched=True)


def test_config_normalises_preferred_sizes_and_rejects_contradictions():
    assert SchedulerConfig(max_batch_size=8, preferred_batch_sizes=[8, 2, 2]).preferred_batch_sizes == (2, 8)
    with pytest.raises(ValueError, match="preferred_batch_size 16"):
        SchedulerConfig(max_batch_size=8, preferred_batch_sizes=(16,))
    with pytest.raises(ValueError, match="timeout_action"):
        SchedulerConfig(max_batch_size=8, timeout_action="DROP")
    with pytest.raises(ValueError, match="default_priority_level"):
        SchedulerConfig(max_batch_size=8, priority_levels=3)


def test_priority_and_timeout_resolution_follow_triton():
    cfg = SchedulerConfig(max_batch_size=4, priority_levels=3, default_priority_level=2,
                         default_timeout_us=1000, allow_timeout_override=True)
    assert [cfg.priority_of(p) for p in (0, 1, 3, 4)] == [2, 1, 3, 2]
    assert [cfg.timeout_of(t) for t in (None, 0, 500, 5000)] == [1000, 1000, 500, 1000]
    assert SchedulerConfig(max_batch_size=4, default_timeout_us=1000).timeout_of(500) == 1000  # override not allowed
    assert SchedulerConfig(max_batch_size=4).priority_of(3) == 0  # one level


def test_queue_counts_its_rows_through_every_way_out():
    """RequestQueue.rows (the adaptive wait's sample) after adds, take, remove, cancellation and take_all."""

    class Done:
        def __init__(self, done: bool):
            self._done = done

        def done(self) -> bool:
            return self._done

    q = RequestQueue()
    entries = [Entry(Pending(i, size, "k", 0), {}, Done(i == 3)) for i, size in enumerate([1, 2, 3, 4, 5])]
    for e in entries:
        q.add(e)
    assert q.rows == 15
    q.take([0, 1])
    assert q.rows == 12
    assert q.remove(2) is entries[2] and q.remove(2) is None and q.rows == 9
    assert q.drop_cancelled() == [entries[3]] and q.rows == 5
    assert q.take_all() == [entries[4]] and q.rows == 0


def test_response_order_holds_later_answers_until_earlier_ones_are_settled():
    sent: list[int] = []
    order = ResponseOrder(preserve=True)
    for i in range(4):
        order.register(i)
    order.deliver(2, lambda: sent.append(2))
    order.deliver(1, lambda: sent.append(1))
    assert sent == []
    order.drop(0)  # cancelled: releases 1 and 2
    assert sent == [1, 2]
    order.deliver(3, lambda: sent.append(3))
    assert sent == [1, 2, 3]
    unordered = ResponseOrder(preserve=False)
    unordered.deliver(7, lambda: sent.append(7))
    assert sent[-1] == 7


def test_concat_then_split_round_trips_rows():
    reqs = [{"x": np.arange(n * 2, dtype=np.float32).reshape(n, 2) + 10 * n} for n in (1, 3, 2)]
    merged = concat_inputs(reqs)
    assert merged["x"].shape == (6, 2)
    parts = split_outputs({"x": merged["x"]}, [1, 3, 2])
    for req, part in zip(reqs, parts, strict=True):
        np.testing.assert_array_equal(part["x"], req["x"])
        assert not np.shares_memory(part["x"], merged["x"])


def test_split_names_the_output_that_has_no_batch_dim():
    with pytest.raises(InferenceError, match="output 'scores' has shape \\[5, 2\\]"):
        split_outputs({"scores": np.zeros((5, 2))}, [1, 3])


class ArenaLike:
    """Returns a view into a buffer it reuses, as an engine instance with an arena may."""

    def __init__(self) -> None:
        self.arena = np.zeros(16, np.float32)

    def run_timed(self, inputs):
        n = inputs["x"].size
        self.arena[:n] = inputs["x"].ravel() * 3
        return {"y": self.arena[:n].reshape(inputs["x"].shape)}, RunTimings(0, 0, 0)


def test_single_request_outputs_survive_the_next_run():
    inst = ArenaLike()
    first, _ = run_batch(inst, [{"x": np.ones((1, 2), np.float32)}], [1])
    run_batch(inst, [{"x": np.full((1, 2), 5, np.float32)}], [1])
    np.testing.assert_array_equal(first[0]["y"], [[3, 3]])
