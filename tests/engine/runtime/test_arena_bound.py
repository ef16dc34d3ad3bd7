"""The arena against the in-place live-bytes bound computed apart from the planner (live_bound.py), on every
committed fixture model at its own batch and at batch 4."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_models import cases, fixture_names, max_shapes, model_path
from live_bound import live_bound

import engine
from engine.runtime.loading import check_supported, prepare, read_graph
from engine.runtime.model import Model

SLACK = 1.05
BATCH = 4
# Exports whose graph fixes the batch inside (a reshape to [1, ...], a constant of the traced batch): they run at
# their own batch only.
BATCH_FIXED = {"misc_shapes", "transformer", "two_inputs", "vit", "yolo"}


def check(inst) -> None:
    bound = live_bound(inst._compiled, inst.graph)
    arena = inst.memory_plan.arena_bytes
    assert bound <= arena <= SLACK * bound, f"arena {arena} vs bound {bound}: {arena / max(bound, 1):.3f}x"
    assert not set(inst.graph.inputs) & set(inst.memory_plan.sizes), "graph inputs are not in the arena"


@pytest.mark.parametrize("name", fixture_names())
def test_arena_within_5_percent_of_bound(name):
    check(engine.load(model_path(name)).instance(max_shapes=max_shapes(name)))


def batch_free(name: str) -> Model:
    """The fixture with its inputs' batch dim made dynamic (pnnx records the traced batch)."""
    graph = read_graph(model_path(name))
    for v in graph.inputs:
        v.shape = (-1, *v.shape[1:])
    check_supported(graph)
    return Model(prepare(graph), model_path(name))


@pytest.mark.parametrize("name", [n for n in fixture_names() if n not in BATCH_FIXED])
def test_arena_within_5_percent_of_bound_at_batch_4(name):
    model = batch_free(name)
    inst = model.instance(max_shapes={k: (BATCH, *s[1:]) for k, s in max_shapes(name).items()})
    check(inst)
    feeds, want = cases(name)[0]  # the plan also computes the right thing: every row as the batch-1 case
    got = inst.run({k: np.concatenate([a] * (BATCH // len(a))) for k, a in feeds.items()})
    for k, w in want.items():
        np.testing.assert_allclose(got[k][:len(w)], w, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(w).max())))
        np.testing.assert_allclose(got[k][-len(w):], w, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(w).max())))


def test_batch_fixed_list_is_current():
    """A fixture leaves BATCH_FIXED once its graph runs at batch 4 (so the list never hides a runnable model)."""
    for name in sorted(BATCH_FIXED):
        model = batch_free(name)
        with pytest.raises(engine.EngineError):
            model.instance(max_shapes={k: (BATCH, *s[1:]) for k, s in max_shapes(name).items()})
