"""Normalisation CPU kernels vs the references (in place, below max shape, float16), no temporaries."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import check_kernel, kernel_peak_bytes, make_node

from engine.devices.cpu.loops.normalize import layernorm_rows
from engine.ops.norm import reference

RNG = np.random.default_rng(5)


def _x(*shape, scale=3.0, shift=1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale + shift).astype(np.float32)


def test_batchnorm_kernel_in_place_and_below_max():
    node = make_node("BatchNorm", 1, attrs={"scale": _x(4), "bias": _x(4)})
    big, small = _x(2, 4, 6, 6), _x(1, 4, 3, 5)
    check_kernel(node, [big], inplace=True)
    check_kernel(node, [small], [big], inplace=True)
    check_kernel(node, [_x(3, 4)])


@pytest.mark.parametrize("k,affine", [(1, "both"), (2, "weight"), (3, "none"), (1, "bias")])
def test_layernorm_kernel(k, affine):
    x = _x(2, 3, 4, 5)
    norm_shape = x.shape[4 - k:]
    attrs = {}
    if affine in ("both", "weight"):
        attrs["weight"] = _x(*norm_shape)
    if affine in ("both", "bias"):
        attrs["bias"] = _x(*norm_shape)
    node = make_node("LayerNorm", 1, params={"normalized_ndim": k, "eps": 1e-5}, attrs=attrs)
    check_kernel(node, [x])
    check_kernel(node, [x[:1, :2].copy()], [x])


@pytest.mark.parametrize("op,groups", [("GroupNorm", 1), ("GroupNorm", 3), ("GroupNorm", 6), ("InstanceNorm", None)])
def test_groupnorm_kernel(op, groups):
    x = _x(2, 6, 5, 3)
    params = {"eps": 1e-5} if groups is None else {"num_groups": groups, "eps": 1e-5}
    node = make_node(op, 1, params=params, attrs={"weight": _x(6), "bias": _x(6)})
    check_kernel(node, [x])
    check_kernel(node, [x[:1, :, :2, :1].copy()], [x])
    check_kernel(make_node(op, 1, params=params), [_x(3, 6, 7)])


@pytest.mark.parametrize("n", [7, 64, 80, 193])
def test_layernorm_kernel_over_row_chunks(n):
    """Rows by chunks of LN_CHUNK, the last one partial (150 rows), at and below the max shape, in place."""
    x = _x(3, 50, n, shift=4.0)
    node = make_node("LayerNorm", 1, params={"normalized_ndim": 1, "eps": 1e-5},
                     attrs={"weight": _x(n), "bias": _x(n)})
    check_kernel(node, [x])
    check_kernel(node, [x], inplace=True)
    check_kernel(node, [x[:2, :33].copy()], [x])


@pytest.mark.parametrize("rows,lo,hi", [(150, 0, 150), (150, 37, 141)])
def test_layernorm_rows_with_residual(rows, lo, hi):
    """layernorm_rows' x + z first (has_z) against the reference on the sum, over a range of rows only."""
    n = 80
    x, z, w, b = _x(rows, n), _x(rows, n), _x(n), _x(n)
    out = np.full_like(x, np.nan)
    layernorm_rows(x, z, True, out, w.astype(np.float64), b.astype(np.float64), 1e-5, True, True, lo, hi)
    node = make_node("LayerNorm", 1, params={"normalized_ndim": 1, "eps": 1e-5}, attrs={"weight": w, "bias": b})
    want = reference(node, [x + z])[0]
    np.testing.assert_allclose(out[lo:hi], want[lo:hi], rtol=1e-5, atol=1e-5)
    assert np.isnan(out[:lo]).all() and np.isnan(out[hi:]).all()


def test_layernorm_eps_zero_over_a_constant_row_gives_the_references_nan():
    """0 / 0 in the kernel: NaN as the reference and torch give, not a ZeroDivisionError out of the loop."""
    x = _x(3, 8)
    x[1] = 2.5
    node = make_node("LayerNorm", 1, params={"normalized_ndim": 1, "eps": 0.0})
    with np.errstate(invalid="ignore", divide="ignore"):  # the reference's own 0 / 0
        check_kernel(node, [x])


def test_large_offset_keeps_precision():
    # one-pass E[x^2]-E[x]^2 would lose everything here; the kernels use two passes in float64
    x = (RNG.standard_normal((2, 4, 64)) + 1000.0).astype(np.float32)
    check_kernel(make_node("LayerNorm", 1, params={"normalized_ndim": 1}), [x], atol=1e-4)
    check_kernel(make_node("GroupNorm", 1, params={"num_groups": 2}), [x], atol=1e-4)


@pytest.mark.parametrize("p,axis", [(1, 1), (2, -1), (2, 0)])
def test_lpnormalize_kernel(p, axis):
    x = _x(3, 4, 5)
    x[0, :, 0] = 0.0
    node = make_node("LpNormalize", 1, params={"axis": axis, "p": p, "eps": 1e-12})
    check_kernel(node, [x])
    check_kernel(node, [x[:2, 1:, :3].copy()], [x])


@pytest.mark.parametrize("op,params,attrs", [
    ("BatchNorm", {}, {"scale": np.ones(16, np.float32), "bias": np.ones(16, np.float32)}),
    ("LayerNorm", {"normalized_ndim": 1}, {"weight": np.ones(32, np.float32), "bias": np.ones(32, np.float32)}),
    ("GroupNorm", {"num_groups": 4}, {"weight": np.ones(16, np.float32), "bias": np.ones(16, np.float32)}),
    ("InstanceNorm", {}, {}),
])
def test_kernel_allocates_no_temporaries(op, params, attrs):
    x = _x(4, 16, 32, 32)
    assert kernel_peak_bytes(make_node(op, 1, params=params, attrs=attrs), [x]) < 64 * 1024


def test_float16_runs_through_the_reference_path():
    x = _x(2, 4, 5).astype(np.float16)
    check_kernel(make_node("LayerNorm", 1, params={"normalized_ndim": 1}), [x], rtol=1e-2, atol=1e-2)
    check_kernel(make_node("GroupNorm", 1, params={"num_groups": 2}), [x], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 9])
def test_lrn_kernel_at_and_below_max_shape(size):
    x = np.random.default_rng(size).standard_normal((2, 6, 3, 4)).astype(np.float32) * 3
    node = make_node("LRN", 1, params={"size": size, "alpha": 0.3, "beta": 0.75, "bias": 1.5})
    check_kernel(node, [x])
    check_kernel(node, [x[:1, :, :2].copy()], [x])


@pytest.mark.parametrize("threads_n", [1, 2, 3])
def test_float32_layernorm_python_path_region_and_records_give_the_same_bits(threads_n, monkeypatch, request):
    """A float32 LayerNorm runs layernorm_team's cfunc from Python wherever a native program's record would (one
    chunk on this thread, a split as a region), so that a replay gives the Python path's bits (its float64 sums
    are reassociated per compilation); in place too; the dispatcher's loop within float32 rounding."""
    from op_harness import build_kernel, force_native_regions, infos_of, replay

    from engine.devices.cpu import threads as T

    ran = force_native_regions(monkeypatch, request, threads_n, T)  # norm.py asks threads itself
    x = (RNG.standard_normal((37, 77)) * np.logspace(0, 20, 77)).astype(np.float32)  # sums whose order matters
    x[3, 5] = np.nan
    node = make_node("LayerNorm", 1, params={"normalized_ndim": 1, "eps": 1e-5},
                     attrs={"weight": _x(77), "bias": _x(77)})
    kernel, ws = build_kernel(node, infos_of([x]))
    out = np.full_like(x, 7.0)
    kernel([x], [out], ws)
    y = x.copy()
    kernel([y], [y], ws)
    np.testing.assert_array_equal(y, out)
    assert ran == ([True, True] if threads_n > 1 else [])
    replayed = np.full_like(x, 7.0)
    native = kernel.native([x], [replayed], ws)
    assert replay(native) is None
    np.testing.assert_array_equal(replayed, out)
    want = np.empty_like(x)
    layernorm_rows(x, x, False, want, node.attrs["weight"].astype(np.float64), node.attrs["bias"].astype(np.float64),
                   1e-5, True, True, 0, 37)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
