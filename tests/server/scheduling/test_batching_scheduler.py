"""Scheduler with fake instances: merging under concurrency, per-request splitting, ordering and draining."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from batching_fakes import FakeInstance, RecordingMetrics, arun, reference, rows, until

from server.errors import InvalidArgumentError, UnavailableError
from server.scheduling import Scheduler, SchedulerConfig


def check_rows(request: dict[str, np.ndarray], result) -> None:
    want = reference(request["x"])
    assert set(result.outputs) == set(want)
    for name, arr in want.items():
        np.testing.assert_allclose(result.outputs[name], arr, rtol=1e-6)


def test_eight_concurrent_submitters_get_merged_batches_and_their_own_rows():
    inst, metrics = FakeInstance(delay=0.01), RecordingMetrics()
    sched = Scheduler(SchedulerConfig(max_batch_size=8), [inst], metrics=metrics)

    async def client(c: int):
        for k in range(4):
            request = rows(100 * c + 10 * k, n=1 + (c + k) % 2)
            check_rows(request, await sched.submit(request))

    async def main():
        await sched.start()
        await asyncio.gather(*(client(c) for c in range(8)))
        await sched.stop()

    arun(main())
    sizes = [b.shape[0] for b in inst.batches]
    assert max(sizes) > 1, f"no merging happened: {sizes}"
    assert max(sizes) <= 8
    assert sum(sizes) == sum(1 + (c + k) % 2 for c in range(8) for k in range(4))
    assert any(size > 1 for size, _ in metrics.batches)
    assert metrics.outcomes.count("SUCCESS") == 32 and metrics.depths[-1] == 0


def test_split_hands_each_caller_exactly_its_rows_as_copies():
    inst = FakeInstance(gated=True)
    sched = Scheduler(SchedulerConfig(max_batch_size=8), [inst])
    requests = [rows(0.0), rows(10.0, n=2), rows(20.0, n=3), rows(30.0)]

    async def main():
        await sched.start()
        first = asyncio.create_task(sched.submit(rows(-5.0)))
        await until(lambda: inst.active == 1)  # the instance is busy, the next four queue up together
        tasks = [asyncio.create_task(sched.submit(r)) for r in requests]
        await until(lambda: sched.queue_depth == 4)
        inst.gate.set()
        await first
        return await asyncio.gather(*tasks)

    results = arun(main())
    assert [b.shape[0] for b in inst.batches] == [1, 7]
    for request, result in zip(requests, results, strict=True):
        check_rows(request, result)
        assert result.execution.batch_size == 7
        assert result.outputs["y"].base is None or not np.shares_memory(result.outputs["y"], results[0].outputs["y"])


def test_different_shapes_are_never_merged():
    inst = FakeInstance(gated=True)
    sched = Scheduler(SchedulerConfig(max_batch_size=8), [inst])
    requests = [rows(float(i), shape=(3, 2) if i % 2 else (4,)) for i in range(6)]

    async def main():
        await sched.start()
        first = asyncio.create_task(sched.submit(rows(-1.0)))
        await until(lambda: inst.active == 1)
        tasks = [asyncio.create_task(sched.submit(r)) for r in requests]
        await until(lambda: sched.queue_depth == 6)
        inst.gate.set()
        await first
        return await asyncio.gather(*tasks)

    for request, result in zip(requests, arun(main()), strict=True):
        check_rows(request, result)
    assert [b.shape for b in inst.batches[1:]] == [(3, 4), (3, 3, 2)]  # the oldest request picks the shape


def test_each_instance_is_used_by_one_thread_at_a_time():
    instances = [FakeInstance(delay=0.005), FakeInstance(delay=0.005)]
    sched = Scheduler(SchedulerConfig(max_batch_size=4), instances)

    async def main():
        await sched.start()
        await asyncio.gather(*(sched.submit(rows(float(i))) for i in range(24)))
        await sched.stop()

    arun(main())
    assert all(inst.max_active == 1 for inst in instances)
    assert sorted(v for inst in instances for v in inst.rows_seen) == [float(i) for i in range(24)]


def test_model_without_batching_gets_inputs_unchanged_and_one_request_per_run():
    inst = FakeInstance(delay=0.005)
    sched = Scheduler(SchedulerConfig(max_batch_size=0), [inst])
    requests = [{"x": np.full((3, 2), float(i), dtype=np.float32)} for i in range(5)]

    async def main():
        await sched.start()
        return await asyncio.gather(*(sched.submit(r) for r in requests))

    for request, result in zip(requests, arun(main()), strict=True):
        check_rows(request, result)
        assert result.execution.batch_size == 1
    assert [b.shape for b in inst.batches] == [(3, 2)] * 5


def test_higher_priority_runs_first():
    inst = FakeInstance(gated=True)
    cfg = SchedulerConfig(max_batch_size=1, priority_levels=2, default_priority_level=2)
    sched = Scheduler(cfg, [inst])

    async def main():
        await sched.start()
        first = asyncio.create_task(sched.submit(rows(0.0)))
        await until(lambda: inst.active == 1)
        low = asyncio.create_task(sched.submit(rows(1.0)))  # default level 2
        high = asyncio.create_task(sched.submit(rows(2.0), priority=1))
        await until(lambda: sched.queue_depth == 2)
        inst.gate.set()
        await asyncio.gather(first, low, high)

    arun(main())
    assert inst.rows_seen == [0.0, 2.0, 1.0]


def test_preserve_ordering_answers_in_arrival_order():
    slow, fast = FakeInstance(gated=True), FakeInstance()
    sched = Scheduler(SchedulerConfig(max_batch_size=1, preserve_ordering=True), [fast, slow])
    done: list[int] = []

    async def call(i: int):
        await sched.submit(rows(float(i)))
        done.append(i)

    async def main():
        await sched.start()
        first = asyncio.create_task(call(0))  # takes `slow` (instances are used last-in first-out)
        await until(lambda: slow.active == 1)
        second = asyncio.create_task(call(1))
        await until(lambda: len(fast.batches) == 1)
        await asyncio.sleep(0.02)
        assert done == []  # 1 finished but must wait for 0
        slow.gate.set()
        await asyncio.gather(first, second)

    arun(main())
    assert done == [0, 1]


def test_max_queue_delay_waits_for_a_fuller_batch():
    inst = FakeInstance()
    sched = Scheduler(SchedulerConfig(max_batch_size=4, max_queue_delay_us=5_000_000), [inst])

    async def main():
        await sched.start()
        tasks = []
        for i in range(4):  # arrive one by one, well inside the 5 s delay; the 4th fills the batch
            tasks.append(asyncio.create_task(sched.submit(rows(float(i)))))
            await asyncio.sleep(0.005)
        return await asyncio.gather(*tasks)

    results = arun(main())
    assert [b.shape[0] for b in inst.batches] == [4]
    assert all(r.execution.batch_size == 4 and r.queue_ns > 0 for r in results)


def test_adaptive_wait_sends_a_lone_request_at_once_and_still_merges_concurrent_ones():
    """wait_policy "adaptive" with a 5 s delay: a lone client's requests never wait it out; once four clients
    have had requests in the server together, four arrivals are merged without waiting either."""
    inst = FakeInstance(delay=0.02)
    sched = Scheduler(SchedulerConfig(max_batch_size=8, max_queue_delay_us=5_000_000, wait_policy="adaptive"),
                      [inst])

    async def main():
        await sched.start()
        started = asyncio.get_running_loop().time()
        for i in range(3):
            await sched.submit(rows(float(i)))
        lone = asyncio.get_running_loop().time() - started
        await asyncio.gather(*(sched.submit(rows(10.0 + i)) for i in range(4)))  # seen 4 in the server at once

        async def client(c: int):
            for k in range(3):
                await sched.submit(rows(100.0 * c + k))

        started = asyncio.get_running_loop().time()
        await asyncio.gather(*(client(c) for c in range(4)))
        together = asyncio.get_running_loop().time() - started
        await sched.stop()
        return lone, together

    lone, together = arun(main())
    assert lone < 1.0 and together < 2.0, (lone, together)  # the 5 s delay was never waited out
    sizes = [b.shape[0] for b in inst.batches]
    assert sizes[:3] == [1, 1, 1] and max(sizes[3:]) >= 2, sizes


def test_adaptive_wait_follows_the_peak_out_of_its_window():
    """After four clients had requests in the server together, a lone request waits only until that peak leaves
    the (here 0.2 s) window, not the 5 s delay: the scheduler decides again when the peak expires."""
    inst = FakeInstance()
    sched = Scheduler(SchedulerConfig(max_batch_size=8, max_queue_delay_us=5_000_000, wait_policy="adaptive"),
                      [inst], population_window_ns=200_000_000)

    async def main():
        await sched.start()
        await asyncio.gather(*(sched.submit(rows(float(i))) for i in range(4)))  # a peak of 4 rows
        started = asyncio.get_running_loop().time()
        await sched.submit(rows(9.0))
        waited = asyncio.get_running_loop().time() - started
        await sched.stop()
        return waited

    waited = arun(main())
    assert waited < 1.0, waited  # at most the 0.2 s window (plus scheduling), never the 5 s delay


def test_full_wait_is_tritons_a_lone_request_waits_the_delay():
    inst = FakeInstance()
    sched = Scheduler(SchedulerConfig(max_batch_size=8, max_queue_delay_us=300_000), [inst])

    async def main():
        await sched.start()
        started = asyncio.get_running_loop().time()
        await sched.submit(rows(1.0))
        waited = asyncio.get_running_loop().time() - started
        await sched.stop()
        return waited

    assert arun(main()) >= 0.29


def test_stop_with_drain_finishes_everything_queued_and_running():
    inst = FakeInstance(gated=True)
    # A long delay would hold a partial batch for 10 s; draining must dispatch it at once.
    sched = Scheduler(SchedulerConfig(max_batch_size=4, max_queue_delay_us=10_000_000), [inst])
    requests = [rows(float(i)) for i in range(10)]

    async def main():
        await sched.start()
        tasks = [asyncio.create_task(sched.submit(r)) for r in requests]
        await until(lambda: inst.active == 1 and sched.queue_depth == 6)  # 4 running, 6 queued
        stopping = asyncio.create_task(sched.stop(drain=True))
        await asyncio.sleep(0.01)
        with pytest.raises(UnavailableError):
            await sched.submit(rows(0.0))
        inst.gate.set()
        await asyncio.wait_for(stopping, 5)
        assert all(t.done() for t in tasks)
        return [t.result() for t in tasks]

    for request, result in zip(requests, arun(main()), strict=True):
        check_rows(request, result)
    assert [b.shape[0] for b in inst.batches] == [4, 4, 2]


def test_stop_without_drain_fails_queued_but_finishes_running():
    inst = FakeInstance(gated=True)
    sched = Scheduler(SchedulerConfig(max_batch_size=1), [inst])

    async def main():
        await sched.start()
        running = asyncio.create_task(sched.submit(rows(0.0)))
        await until(lambda: inst.active == 1)
        queued = asyncio.create_task(sched.submit(rows(1.0)))
        await until(lambda: sched.queue_depth == 1)
        stopping = asyncio.create_task(sched.stop(drain=False))
        with pytest.raises(UnavailableError):
            await queued
        inst.gate.set()
        await stopping
        check_rows(rows(0.0), await running)

    arun(main())
    assert inst.rows_seen == [0.0]


def test_bad_batch_dims_are_rejected_before_queueing():
    sched = Scheduler(SchedulerConfig(max_batch_size=2), [FakeInstance()])

    async def main():
        await sched.start()
        with pytest.raises(InvalidArgumentError, match="max_batch_size"):
            await sched.submit(rows(0.0, n=3))
        with pytest.raises(InvalidArgumentError, match="batch dimension"):
            await sched.submit({"x": np.zeros((1, 2)), "z": np.zeros((2, 2))})
        await sched.stop()

    arun(main())
