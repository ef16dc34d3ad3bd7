"""The float32 activation passes (sigmoid, SiLU, erf GELU) split as one native OpenMP region
(epilogue._native_pass, loops/pointwise.pass_team): every element written once, against float64 definitions of
the functions and bit for bit against the one-thread loops, in place and into another buffer; the Python split
wherever the region does not apply."""

from __future__ import annotations

import math

import numpy as np
import pytest
from op_harness import cpu_device, replay

from engine.devices.cpu import epilogue
from engine.devices.cpu import threads as pool
from engine.devices.cpu.fused_calls import Native
from engine.devices.cpu.loops import pointwise as mk
from engine.ops import epilogue as meaning

KINDS = {
    mk.PASS_SIGMOID: (epilogue.sigmoid_f32, mk.sigmoid_f32_range, lambda v: 1 / (1 + np.exp(-v))),
    mk.PASS_SILU: (epilogue.silu_f32, mk.silu_f32_range, lambda v: v / (1 + np.exp(-v))),
    mk.PASS_GELU: (epilogue.gelu_f32, mk.gelu_f32_range,
                   lambda v: 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2)))),
}


def _on_openmp_team() -> bool:
    cpu_device()
    return pool.pool_kind(pool.get_policy(), pool._openmp is not None) == "openmp"


@pytest.fixture
def regions(monkeypatch, request):
    """Every pass split (MIN_WORK, NATIVE_PASS_ELEMENTS 0) on the native region, even where the suite's team
    sleeps; records each region run and whether it ran."""
    if not _on_openmp_team():
        pytest.skip("our kernels do not run on OpenMP's team here (no oneDNN, or the `short` wait policy)")
    runs: list[bool] = []
    real = epilogue.run_native

    def spy(fn, data):
        runs.append(real(fn, data))
        return runs[-1]
    monkeypatch.setattr(epilogue, "run_native", spy)
    monkeypatch.setattr(epilogue, "native_regions", lambda: True)
    monkeypatch.setattr(pool, "MIN_WORK", 0)
    monkeypatch.setattr(epilogue, "NATIVE_PASS_ELEMENTS", 0)
    before = pool.get_threads()
    request.addfinalizer(lambda: pool.set_threads(before))
    return runs


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("n", [1, 15, 17, 1000, 262_147])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_native_pass_matches_the_definition_and_the_loop(kind, n, threads, regions):
    pool.set_threads(threads)
    f32_pass, loop, exact = KINDS[kind]
    rng = np.random.default_rng(n + kind)
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    x[:: 101] = np.array([0.0, -0.0, 30.0, -30.0, np.inf, -np.inf], np.float32)[np.arange(len(x[::101])) % 6]
    want = np.empty_like(x)
    loop(x, want, 0, n)
    out = np.full(n, np.nan, np.float32)
    f32_pass(x, out)  # into another buffer
    y = x.copy()
    f32_pass(y, y)  # in place
    assert regions == [True, True]  # a thread's share may be empty: every thread still runs the region
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(y, want)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = exact(x.astype(np.float64))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(out[finite], ref[finite], rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("n,team", [(0, 2), (1, 2), (16, 2), (17, 2), (100, 3), (1000, 7), (5, 8), (64, 1)])
def test_shares_cover_every_element_once(n, team):
    seen = np.zeros(n, np.int64)
    for t in range(team):
        lo, hi = mk.pass_share(n, t, team)
        assert 0 <= lo <= hi <= n and (lo == n or lo % 16 == 0)
        seen[lo:hi] += 1
    assert (seen == 1).all()


def test_the_python_split_runs_where_the_region_does_not(regions, monkeypatch):
    """A busy team (run_native answers False) and arrays the region cannot take (not float32 1-d contiguous of one
    size) go to parallel_for, with the same result."""
    x = np.linspace(-6, 6, 40_000, dtype=np.float32)
    want = np.empty_like(x)
    mk.silu_f32_range(x, want, 0, x.size)
    monkeypatch.setattr(epilogue, "run_native", lambda fn, data: False)
    out = np.empty_like(x)
    epilogue.silu_f32(x, out)
    np.testing.assert_array_equal(out, want)
    assert not epilogue._native_pass(mk.PASS_SILU, x[::2], np.empty(20_000, np.float32))
    assert not epilogue._native_pass(mk.PASS_SILU, x, np.empty(39_999, np.float32))
    assert not epilogue._native_pass(mk.PASS_SILU, x.astype(np.float64), np.empty(40_000, np.float64))


def test_small_passes_stay_on_the_calling_thread(monkeypatch):
    """Under NATIVE_PASS_ELEMENTS (or on one thread) a pass runs where it is called: no region at all."""
    calls = []
    monkeypatch.setattr(epilogue, "run_native", lambda fn, data: calls.append(fn) or False)
    monkeypatch.setattr(epilogue, "native_regions", lambda: True)
    x = np.linspace(-6, 6, epilogue.NATIVE_PASS_ELEMENTS - 1, dtype=np.float32)
    want = np.empty_like(x)
    mk.gelu_f32_range(x, want, 0, x.size)
    epilogue.gelu_f32(x, x)
    np.testing.assert_array_equal(x, want)
    assert not calls


@pytest.mark.parametrize("split", [False, True], ids=["one-thread", "region"])
@pytest.mark.parametrize("params", [{}, {"alpha": 0.2, "beta": 0.5}, {"alpha": -1.0, "beta": 0.0},
                                    {"alpha": 3e38, "beta": 1.0}])
@pytest.mark.parametrize("n", [1, 17, 4099])
def test_hardsigmoid_pass_is_the_references_numpy_steps(n, params, split, request):
    """A late hard-sigmoid (a conv's or a matmul's: apply_activation) by pass_team's float32 loop, run and replayed
    from its records: bit for bit the reference's numpy steps (x * alpha, + beta, clip to [0, 1]: two roundings),
    NaN kept, infinities and an overflowing alpha clipped, on one thread or split as a region."""
    if split:
        request.getfixturevalue("regions")
        pool.set_threads(3)
    else:
        cpu_device()
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 8).astype(np.float32)
    x[::7] = np.array([np.nan, np.inf, -np.inf, -0.0, 3.0, -3.0, 2.5], np.float32)[np.arange(len(x[::7])) % 7]
    want = x.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        meaning.hardsigmoid(want, params)
    y = x.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        epilogue.apply_activation("hardsigmoid", params, y)
    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))  # signed zeros, NaN payloads
    got = x.copy()
    records, keep = epilogue.activation_records("hardsigmoid", params, got)
    assert replay(Native(records, [], keep)) is None
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
