"""The scheduler over real engine instances: requests merged into one batch still get PyTorch's answer.

The fixture is the dynamic-batch PNNX model in tests/fixtures/pnnx/dynamic; its expected outputs were computed by
PyTorch (tools/make_fixtures.py), an oracle independent of both the engine and the batcher."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from batching_fakes import arun

import engine
from server.scheduling import Scheduler, SchedulerConfig

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "pnnx" / "dynamic"


@pytest.mark.slow  # the first run in a fresh checkout compiles the numba kernels
def test_merged_requests_each_get_their_pytorch_rows():
    model = engine.load(str(FIXTURE / "model.pnnx.param"))
    instances = [model.instance(max_shapes={"in0": (4, 3, 64, 64)}) for _ in range(2)]
    x = np.load(FIXTURE / "inputs.npz")["in0"]  # 2 samples
    expected = dict(np.load(FIXTURE / "expected.npz"))
    # A long delay holds the requests until the batch is full (4 rows), so all four run as one execution.
    sched = Scheduler(SchedulerConfig(max_batch_size=4, max_queue_delay_us=10_000_000), instances)
    picks = [[1], [0], [0, 1]]  # rows of the fixture each request carries: 1 + 1 + 2 = 4

    async def main():
        await sched.start()
        results = await asyncio.gather(*(sched.submit({"in0": x[rows]}) for rows in picks))
        await sched.stop()
        return results

    for rows, result in zip(picks, arun(main(), timeout=120), strict=True):
        assert result.execution.batch_size == 4
        for name, want in expected.items():
            np.testing.assert_allclose(result.outputs[name], want[rows], rtol=1e-4, atol=1e-5, err_msg=name)
