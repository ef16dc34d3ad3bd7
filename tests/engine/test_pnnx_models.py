"""Every committed PNNX fixture (made by tools/make_fixtures.py from real PyTorch models) runs on the engine and
matches PyTorch's eval output: max abs error <= 1e-4 * max(1, max|expected|), same shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import engine

FIXTURE_ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "pnnx"
NAMES = sorted(p.name for p in FIXTURE_ROOT.iterdir() if (p / "meta.json").exists()) if FIXTURE_ROOT.is_dir() else []
DYNAMIC = [n for n in NAMES if (FIXTURE_ROOT / n / "inputs_0.npz").exists()]
RTOL_OF_SCALE = 1e-4


def assert_outputs_match(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], where: str) -> None:
    assert sorted(got) == sorted(expected), f"{where}: output names {sorted(got)} != {sorted(expected)}"
    for name, want in expected.items():
        out = np.asarray(got[name])
        assert out.shape == want.shape, f"{where}/{name}: shape {out.shape} != {want.shape}"
        if want.dtype.kind in "iub":
            np.testing.assert_array_equal(out, want, err_msg=f"{where}/{name}")
            continue
        # The bar: max abs error below 1e-4 of the output's scale (its largest magnitude).
        tol = RTOL_OF_SCALE * float(np.abs(want).max(initial=0.0))
        err = float(np.abs(out.astype(np.float64) - want).max(initial=0.0))
        assert np.isfinite(out).all(), f"{where}/{name}: non-finite values"
        assert err <= tol, f"{where}/{name}: max abs error {err:.3e} > {tol:.3e}"


def test_fixtures_present() -> None:
    # Guards the parametrised tests below against silently collecting nothing.
    assert len(NAMES) >= 15, f"expected the PNNX fixture set in {FIXTURE_ROOT}, found {NAMES}"
    assert DYNAMIC, "no dynamic-shape fixture (inputs_<k>.npz cases) found"


@pytest.mark.parametrize("name", NAMES)
def test_model_io_matches_meta(name: str, load_fixture) -> None:
    fx = load_fixture(name)
    model = engine.load(fx.param)
    dynamic = fx.meta.get("max_shapes") is not None
    assert [t.name for t in model.inputs] == [e["name"] for e in fx.meta["inputs"]]
    assert [t.name for t in model.outputs] == [e["name"] for e in fx.meta["outputs"]]
    for spec, entry in zip(model.inputs, fx.meta["inputs"], strict=True):
        assert np.dtype(spec.dtype) == np.dtype(entry["dtype"]), f"{name}/{spec.name} dtype"
        shape = tuple(spec.shape)
        if dynamic:
            # Dynamic dims are -1; the fixed ones (channels) must match the export shape.
            assert -1 in shape, f"{name}/{spec.name}: exported with inputshape2 but shape {shape} has no -1"
            assert all(d in (-1, e) for d, e in zip(shape, entry["shape"], strict=True))
        else:
            assert shape == tuple(entry["shape"])


@pytest.mark.parametrize("name", NAMES)
def test_matches_pytorch(name: str, load_fixture) -> None:
    fx = load_fixture(name)
    inst = engine.load(fx.param).instance(device="cpu", max_shapes=fx.max_shapes)
    assert_outputs_match(inst.run(fx.inputs), fx.expected, name)
    plan = inst.memory_plan
    assert 0 < plan.arena_bytes <= plan.naive_bytes
    assert plan.weights_bytes > 0
    # Issue 2: the arena is at most 5% above the bytes live at once in execution order.
    assert plan.arena_bytes <= 1.05 * plan.peak_live_bytes, (plan.arena_bytes, plan.peak_live_bytes, plan.strategy)


@pytest.mark.parametrize("name", DYNAMIC)
def test_dynamic_cases_on_one_instance(name: str, load_fixture) -> None:
    fx = load_fixture(name)
    assert fx.max_shapes is not None and len(fx.cases) >= 3
    inst = engine.load(fx.param).instance(device="cpu", max_shapes=fx.max_shapes)
    arena, arena_bytes = inst.arena, inst.memory_plan.arena_bytes
    address, nbytes = arena.ctypes.data, arena.nbytes
    # Max shape first, then smaller ones, then the max shape again: all inside the arena sized once.
    order = list(range(len(fx.cases))) + [0]
    shapes_seen = set()
    for k in order:
        case_in, case_out = fx.cases[k]
        got = inst.run(case_in)
        assert_outputs_match(got, case_out, f"{name} case {k} {fx.meta['cases'][k]}")
        assert inst.arena is arena, "the instance replaced its arena"
        assert (inst.arena.ctypes.data, inst.arena.nbytes) == (address, nbytes)
        assert inst.memory_plan.arena_bytes == arena_bytes
        for out in got.values():
            # Outputs belong to the caller: they must not alias the arena a later run overwrites.
            assert not np.shares_memory(out, arena)
        shapes_seen.add(tuple(tuple(a.shape) for a in case_in.values()))
    assert len(shapes_seen) >= 3, "the dynamic fixture should exercise several input shapes"


@pytest.mark.shared
def test_bundled_ultraface_pnnx_matches_onnx_runtime(repo_root: Path, shared_dir: Path) -> None:
    """model_repository/ultraface_pnnx (rebuilt by tools/make_ultraface_pnnx.py) against ONNX Runtime's outputs."""
    ref = np.load(shared_dir / "models" / "tnn" / "ultraface_slim320" / "reference.npz")
    model = engine.load(repo_root / "model_repository" / "ultraface_pnnx" / "1" / "model.pnnx.param")
    got = model.instance(device="cpu").run({"in0": ref["input"]})
    assert_outputs_match(got, {"out0": ref["scores"], "out1": ref["boxes"]}, "ultraface_pnnx")
