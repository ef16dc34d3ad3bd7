"""The real pnnx exports of tests/fixtures/pnnx_lower (tools/make_lower_pnnx_fixtures.py) through the whole
runtime: lowering, passes, compiled kernels and the arena, against the PyTorch outputs saved with them.
tests/engine/formats/pnnx/test_pnnx_lowering.py checks the same exports through the ops' numpy references."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import engine

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pnnx_lower"
CASES = sorted(p for p in FIXTURES.iterdir() if (p / "model.pnnx.param").exists())


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_export_runs_like_torch(case):
    model = engine.load(case / "model.pnnx.param")
    runs = [np.load(f) for f in sorted(case.glob("io*.npz"))]  # io2.npz: a second shape (dynamic dims)
    names = [spec.name for spec in model.inputs]
    max_shapes = {n: tuple(np.max([io[f"in{i}"].shape for io in runs], axis=0)) for i, n in enumerate(names)}
    instance = model.instance(max_shapes=max_shapes)
    for io in runs:
        got = instance.run({n: io[f"in{i}"] for i, n in enumerate(names)})
        for i, spec in enumerate(model.outputs):
            want = io[f"out{i}"]
            a = got[spec.name]
            assert a.shape == want.shape
            np.testing.assert_allclose(a, want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())))
