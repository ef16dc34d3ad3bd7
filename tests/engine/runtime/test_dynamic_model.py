"""A dynamic-shape fixture on one instance: the max shape and several smaller ones against PyTorch's outputs,
all inside the arena allocated once."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_models import assert_close_to_torch, cases, max_shapes, model_path

import engine
from engine.errors import ArenaOverflowError


def test_dynamic_model_runs_all_shapes_in_one_arena():
    model = engine.load(model_path("dynamic"))
    assert model.inputs[0].shape == (-1, 3, -1, -1)
    assert [o.shape for o in model.outputs] == [(-1, -1, 6), (-1, 4)]  # inferred from the dynamic dims
    inst = model.instance(max_shapes=max_shapes("dynamic"))
    arena, address = inst.arena, inst.arena.ctypes.data
    runs = cases("dynamic")
    assert len({tuple(f["in0"].shape) for f, _ in runs}) >= 4
    for feeds, want in runs + runs[:1]:  # back to the max shape after the small ones
        assert_close_to_torch(inst.run(feeds), want)
    assert inst.arena is arena and inst.arena.ctypes.data == address
    too_big = {"in0": np.zeros((3, 3, 64, 64), np.float32)}
    with pytest.raises(ArenaOverflowError, match="larger than the instance's max"):
        inst.run(too_big)
