"""The planner and the arena on every committed fixture model (tests/fixtures/pnnx/*)."""

from __future__ import annotations

import tracemalloc

import pytest
from fixture_models import cases, fixture_names, max_shapes, model_path

import engine
from engine.runtime.instance import FUSE_AFTER_RUNS


@pytest.mark.parametrize("name", fixture_names())
def test_arena_within_5_percent_of_live_peak(name):
    inst = engine.load(model_path(name)).instance(max_shapes=max_shapes(name))
    p = inst.memory_plan
    assert p.peak_live_bytes <= p.arena_bytes <= 1.05 * p.peak_live_bytes, p
    assert p.arena_bytes <= p.naive_bytes
    assert inst.arena.nbytes == p.arena_bytes


def test_resnet_run_allocates_no_activation_memory():
    inst = engine.load(model_path("resnet")).instance(max_shapes=max_shapes("resnet"))
    assert inst.fallback_nodes == [], "every resnet op should have a CPU kernel"
    feeds, _ = cases("resnet")[0]
    for _ in range(FUSE_AFTER_RUNS):  # binds the call list for this shape, then merges its calls (fused_calls.py)
        inst.run(feeds)
    largest = max(inst.memory_plan.sizes.values())
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    out = inst.run(feeds)
    peak = tracemalloc.get_traced_memory()[1] - before
    tracemalloc.stop()
    outputs = sum(a.nbytes for a in out.values())
    assert peak < outputs + largest // 2, f"run allocated up to {peak} bytes; largest activation {largest}"
