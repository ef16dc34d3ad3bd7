"""Scheduler failure paths: queue full, queue timeout, callers that go away, an instance that raises."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from batching_fakes import FakeInstance, RecordingMetrics, arun, reference, rows, until

from server.errors import QueueFullError, RequestTimeoutError
from server.scheduling import Scheduler, SchedulerConfig


async def busy(sched: Scheduler, inst: FakeInstance) -> asyncio.Task:
    """Occupy the (gated) instance with one request so that later ones stay queued."""
    task = asyncio.create_task(sched.submit(rows(-1.0)))
    await until(lambda: inst.active == 1)
    return task


def test_full_queue_rejects_at_once_and_the_rest_still_runs():
    inst, metrics = FakeInstance(gated=True), RecordingMetrics()
    sched = Scheduler(SchedulerConfig(max_batch_size=1, max_queue_size=2), [inst], metrics=metrics)

    async def main():
        await sched.start()
        first = await busy(sched, inst)
        queued = [asyncio.create_task(sched.submit(rows(float(i)))) for i in range(2)]
        await until(lambda: sched.queue_depth == 2)
        with pytest.raises(QueueFullError, match="Exceeds maximum queue size"):
            await asyncio.wait_for(sched.submit(rows(9.0)), 1)
        inst.gate.set()
        await asyncio.gather(first, *queued)

    arun(main())
    assert 9.0 not in inst.rows_seen and len(inst.batches) == 3
    assert 2 in metrics.depths


def test_request_waiting_past_its_timeout_expires():
    inst, metrics = FakeInstance(gated=True), RecordingMetrics()
    sched = Scheduler(SchedulerConfig(max_batch_size=4, default_timeout_us=100_000), [inst], metrics=metrics)

    async def main():
        await sched.start()
        first = await busy(sched, inst)  # dispatched before its deadline, so it is not cancelled by it
        late = asyncio.create_task(sched.submit(rows(1.0)))
        with pytest.raises(RequestTimeoutError, match="Request timeout expired"):
            await asyncio.wait_for(late, 2)  # answered at the deadline although the instance is still busy
        assert sched.queue_depth == 0
        inst.gate.set()
        await first

    arun(main())
    assert inst.rows_seen == [-1.0]
    assert metrics.outcomes.count("REJECTED") == 1 and metrics.outcomes.count("SUCCESS") == 1


def test_timeout_override_only_shortens_the_default():
    inst = FakeInstance(gated=True)
    cfg = SchedulerConfig(max_batch_size=4, default_timeout_us=5_000_000, allow_timeout_override=True)
    sched = Scheduler(cfg, [inst])

    async def main():
        await sched.start()
        first = await busy(sched, inst)
        short = asyncio.create_task(sched.submit(rows(1.0), timeout_us=50_000))
        longer = asyncio.create_task(sched.submit(rows(2.0), timeout_us=60_000_000))  # capped at the 5 s default
        with pytest.raises(RequestTimeoutError):
            await asyncio.wait_for(short, 2)
        assert not longer.done()
        inst.gate.set()
        await asyncio.gather(first, longer)

    arun(main())
    assert inst.rows_seen == [-1.0, 2.0]


def test_delay_action_runs_expired_requests_after_the_others():
    inst = FakeInstance(gated=True)
    cfg = SchedulerConfig(max_batch_size=1, allow_timeout_override=True, timeout_action="DELAY")
    sched = Scheduler(cfg, [inst])

    async def main():
        await sched.start()
        first = await busy(sched, inst)
        # No default timeout: an override of any length shortens "forever".
        stale = asyncio.create_task(sched.submit(rows(1.0), timeout_us=20_000))
        await asyncio.sleep(0.04)  # its 20 ms timeout passes while the instance is busy
        fresh = asyncio.create_task(sched.submit(rows(2.0)))
        await until(lambda: sched.queue_depth == 2)
        inst.gate.set()
        await asyncio.gather(first, stale, fresh)

    arun(main())
    assert inst.rows_seen == [-1.0, 2.0, 1.0]


def test_cancelled_caller_is_dropped_from_the_queue_and_never_run():
    inst, metrics = FakeInstance(gated=True), RecordingMetrics()
    sched = Scheduler(SchedulerConfig(max_batch_size=4), [inst], metrics=metrics)

    async def main():
        await sched.start()
        first = await busy(sched, inst)
        gone = asyncio.create_task(sched.submit(rows(1.0)))
        with pytest.raises(TimeoutError):  # a gRPC deadline, as the server would apply it
            await asyncio.wait_for(sched.submit(rows(2.0)), 0.02)
        stays = asyncio.create_task(sched.submit(rows(3.0)))
        await until(lambda: sched.queue_depth == 2)
        gone.cancel()  # a client that disconnected
        await until(lambda: sched.queue_depth == 1)
        inst.gate.set()
        await asyncio.gather(first, stays)
        assert gone.cancelled()

    arun(main())
    assert inst.rows_seen == [-1.0, 3.0]
    assert metrics.outcomes.count("CANCELED") == 2


def test_cancel_after_dispatch_drops_only_the_answer():
    inst = FakeInstance(gated=True)
    sched = Scheduler(SchedulerConfig(max_batch_size=4), [inst])

    async def main():
        await sched.start()
        started = asyncio.create_task(sched.submit(rows(1.0)))
        await until(lambda: inst.active == 1)
        started.cancel()
        inst.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await started
        x = rows(2.0)  # the instance is still in service
        result = await sched.submit(x)
        np.testing.assert_allclose(result.outputs["y"], reference(x["x"])["y"])
        await sched.stop()

    arun(main())
    assert inst.rows_seen == [1.0, 2.0]


@pytest.mark.parametrize("dynamic_batching", [True, False])
def test_an_instance_is_free_again_only_when_its_run_has_finished(dynamic_batching):
    """A caller that goes away while its request runs (an HTTP disconnect, a gRPC deadline) must not hand the
    instance to the next request while the worker still runs on it: the next one waits for the run to end."""
    inst, metrics = FakeInstance(gated=True), RecordingMetrics()
    sched = Scheduler(SchedulerConfig(max_batch_size=4, dynamic_batching=dynamic_batching), [inst], metrics=metrics)

    async def main():
        await sched.start()
        running = asyncio.create_task(sched.submit(rows(1.0)))
        await until(lambda: inst.active == 1)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        following = asyncio.create_task(sched.submit(rows(2.0)))
        await asyncio.sleep(0.05)
        assert not following.done() and sched.queue_depth == 1  # waits for the instance, not running beside it
        inst.gate.set()
        x = await following
        await sched.stop()
        return x

    result = arun(main())
    np.testing.assert_allclose(result.outputs["y"], reference(rows(2.0)["x"])["y"])
    assert inst.max_active == 1 and inst.rows_seen == [1.0, 2.0]
    assert metrics.batches == [(1, 1), (1, 1)]  # the cancelled caller's execution did happen and is counted


def test_raising_instance_fails_only_its_batch_and_stays_usable():
    inst, metrics = FakeInstance(gated=True, fail_marker=13.0), RecordingMetrics()
    sched = Scheduler(SchedulerConfig(max_batch_size=4), [inst], metrics=metrics)

    async def main():
        await sched.start()
        first = await busy(sched, inst)
        bad = asyncio.create_task(sched.submit(rows(13.0)))
        neighbour = asyncio.create_task(sched.submit(rows(5.0)))  # same batch as the bad row: fails with it
        await until(lambda: sched.queue_depth == 2)
        inst.gate.set()
        ok = await first
        for task in (bad, neighbour):
            with pytest.raises(RuntimeError, match="marker row"):
                await task
        later = rows(7.0, n=2)
        result = await sched.submit(later)
        np.testing.assert_allclose(result.outputs["total"], reference(later["x"])["total"])
        return ok

    arun(main())
    assert [b.shape[0] for b in inst.batches] == [1, 2, 2]
    assert metrics.outcomes.count("BACKEND") == 2 and metrics.outcomes.count("SUCCESS") == 2
