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
