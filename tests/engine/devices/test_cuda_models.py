"""Whole models end to end on the simulated CUDA device (run by test_cuda_sim.py), against the committed
PyTorch outputs of each fixture (expected.npz), exactly like the CPU model tests."""

from __future__ import annotations

import numpy as np
import pytest

import engine

# small enough for the simulator (each simulated CUDA thread is a Python thread)
PNNX_MODELS = ["two_inputs", "misc_norm_pool", "misc_shapes", "misc_activations"]


def _compare(out: dict[str, np.ndarray], expected: dict[str, np.ndarray], what: str) -> None:
    assert set(out) == set(expected), what
    for name, want in expected.items():
        got = out[name]
        assert got.shape == want.shape and got.dtype == want.dtype, f"{what} {name}: {got.shape} {got.dtype}"
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale, err_msg=f"{what} {name}")


@pytest.mark.parametrize("name", PNNX_MODELS)
def test_pnnx_model_on_cuda_matches_pytorch(name, read_fixture):
    fx = read_fixture(name)
    inst = engine.load(fx.param).instance("cuda", max_shapes=fx.max_shapes)
    assert inst.device.name == "cuda:0" and not isinstance(inst.arena, np.ndarray)
    _compare(inst.run(fx.inputs), fx.expected, name)
    _compare(inst.run(fx.inputs), fx.expected, f"{name} (second run, same arena)")


def test_tnn_model_on_cuda_matches_pytorch(fixtures_dir):
    folder = fixtures_dir / "tnn" / "misc_shapes_v2"
    with np.load(folder / "inputs.npz") as i, np.load(folder / "expected.npz") as e:
        inputs, expected = dict(i), dict(e)
    inst = engine.load(folder / "model.tnnproto").instance("cuda")
    out = inst.run(inputs)
    for name, want in expected.items():  # TNN names outputs by blob; order and shapes follow the source model
        np.testing.assert_allclose(out[name], want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@pytest.mark.slow
def test_dynamic_model_below_max_shape_on_cuda(read_fixture):
    """The arena is planned at the max shape; a smaller request reuses its offsets on the device too."""
    fx = read_fixture("dynamic")
    inst = engine.load(fx.param).instance("cuda", max_shapes=fx.max_shapes)
    k = int(np.argmin([np.prod(s[0]) for s in fx.meta["cases"]]))  # the smallest case keeps the simulator quick
    inputs, expected = fx.cases[k]
    _compare(inst.run(inputs), expected, f"dynamic case {k}")
    assert inst.device.arena_bytes == inst.memory_plan.arena_bytes + inst.memory_plan.workspace_bytes


def test_slices_with_run_time_bounds_on_cuda(fixtures_dir):
    """Slice bounds computed from the input's shape reach the device plan for each request's own shape."""
    folder = fixtures_dir / "pnnx_lower" / "slices_run_time_dynamic"
    with np.load(folder / "io.npz") as a, np.load(folder / "io2.npz") as b:
        cases = [dict(a), dict(b)]
    feeds = [{k: c[k] for k in c if k.startswith("in")} for c in cases]
    max_shapes = {k: tuple(np.maximum(feeds[0][k].shape, feeds[1][k].shape)) for k in feeds[0]}
    inst = engine.load(folder / "model.pnnx.param").instance("cuda", max_shapes=max_shapes)
    for f, c in zip(feeds, cases, strict=True):
        _compare(inst.run(f), {k: c[k] for k in c if k.startswith("out")}, "run-time slices")
