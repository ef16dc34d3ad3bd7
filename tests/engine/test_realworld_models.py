"""The committed real-world fixtures (tests/fixtures/realworld/<model>/: the small models of the suite that
tools/make_realworld.py builds from timm, transformers and ultralytics with random weights) load and match torch:
max abs error <= 1e-3 of each output's largest magnitude. Dynamic variants (pnnx inputshape2) run every case on one
instance sized once for their max shapes, and keep its arena.

A model nnserve cannot run today is listed in KNOWN with the error it gets; its test is a strict xfail that passes
only while that error is raised, so fixing the op turns the test red until its entry here is removed. A model that
pnnx itself exports wrongly is listed in PNNX_BROKEN: refusing it at load is the right answer, and its test
expects that refusal.
`make realworld` runs the whole suite, large models included, and writes docs/realworld.md.
"""

from __future__ import annotations

import numpy as np
import pytest
from model_fixtures import fixture_names
from realworld_known import KNOWN, PNNX_BROKEN

import engine

REL_TOL = 1e-3
NAMES = fixture_names("realworld")
FAMILIES = {"yolo", "cnn", "vit", "hybrid", "text-encoder", "decoder", "audio", "multimodal", "segmentation",
            "detection"}


class KnownFailure(Exception):
    """The failure KNOWN expects for this model (what the strict xfail waits for)."""


def check_outputs(got: dict[str, np.ndarray], want: dict[str, np.ndarray], where: str) -> None:
    assert sorted(got) == sorted(want), f"{where}: outputs {sorted(got)} != {sorted(want)}"
    for name, w in want.items():
        g = np.asarray(got[name])
        assert g.shape == w.shape, f"{where}/{name}: shape {g.shape} != torch's {w.shape}"
        if w.dtype.kind in "iub":
            np.testing.assert_array_equal(g, w, err_msg=f"{where}/{name}")
            continue
        assert np.isfinite(g).all(), f"{where}/{name}: non-finite values"
        scale = max(float(np.abs(w).max(initial=0.0)), 1e-6)
        err = float(np.abs(g.astype(np.float64) - w).max(initial=0.0))
        assert err <= REL_TOL * scale, f"{where}/{name}: max abs error {err:.3e} > {REL_TOL} x {scale:.3e}"


def run_fixture(fx) -> None:  # fx: the load_fixture fixture's ModelFixture
    inst = engine.load(fx.param).instance("cpu", max_shapes=fx.max_shapes)
    if not fx.cases:
        # the first runs are every kernel's Python (instance.FUSE_AFTER_RUNS), the last replays runs of their C
        # calls (devices/cpu/fused_calls.py)
        for k in range(3):
            check_outputs(inst.run(fx.inputs), fx.expected, f"{fx.name} run {k + 1}")
        return
    arena, address, nbytes = inst.arena, inst.arena.ctypes.data, inst.arena.nbytes
    shapes = set()
    for k in [*range(len(fx.cases)), 0]:  # every case, then the max shape again after the smaller ones
        feeds, want = fx.cases[k]
        got = inst.run(feeds)
        check_outputs(got, want, f"{fx.name} case {k} {fx.meta['cases'][k]}")
        assert inst.arena is arena and (inst.arena.ctypes.data, inst.arena.nbytes) == (address, nbytes), \
            f"{fx.name} case {k}: the instance reallocated its arena"
        assert not any(np.shares_memory(out, arena) for out in got.values())
        shapes.add(tuple(a.shape for a in feeds.values()))
    assert len(shapes) >= 2, f"{fx.name}: a dynamic fixture should run several input shapes"


def params() -> list:
    out = []
    for name in sorted(set(NAMES) - set(PNNX_BROKEN)):
        known = KNOWN.get(name)
        marks = [pytest.mark.xfail(strict=True, raises=KnownFailure,
                                   reason=f"{known.error.__name__}: {known.contains}")] if known else []
        out.append(pytest.param(name, marks=marks))
    return out


def test_fixtures_cover_every_family(load_fixture) -> None:
    families = {load_fixture(n, "realworld").meta["family"] for n in NAMES}
    assert families == FAMILIES, f"families without a committed fixture: {sorted(FAMILIES - families)}"
    assert any(load_fixture(n, "realworld").cases for n in NAMES), "no dynamic-shape fixture"


def test_known_failures_are_committed_fixtures() -> None:
    listed = set(KNOWN) | set(PNNX_BROKEN)
    assert listed <= set(NAMES), f"models without a fixture: {sorted(listed - set(NAMES))}"


@pytest.mark.parametrize("name", sorted(PNNX_BROKEN))
def test_wrong_pnnx_exports_are_refused(name: str, load_fixture) -> None:
    fx = load_fixture(name, "realworld")
    broken = PNNX_BROKEN[name]
    with pytest.raises(broken.error) as info:
        run_fixture(fx)
    assert broken.matches(info.value), f"{name}: refused for another reason: {info.value}"


@pytest.mark.parametrize("name", params())
def test_matches_torch(name: str, load_fixture) -> None:
    fx = load_fixture(name, "realworld")
    known = KNOWN.get(name)
    try:
        run_fixture(fx)
    except (engine.EngineError, AssertionError) as exc:
        if known is not None and known.matches(exc):
            raise KnownFailure(str(exc).splitlines()[0]) from exc
        raise
