"""Pooling CPU kernels vs the references (also below max shape), threads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import build_kernel, check_kernel, infos_of, load_cases, make_node, reference, run_kernel

from engine.devices.cpu import kernel as cpu_kernel
from engine.devices.cpu.onednn import objects as onednn_objects
from engine.devices.cpu.onednn import pool as onednn_pool

OPS = {"MaxPool", "AvgPool", "GlobalAvgPool", "GlobalMaxPool", "AdaptiveAvgPool", "AdaptiveMaxPool"}
GOLDENS = Path(__file__).resolve().parents[3] / "fixtures" / "ops" / "spatial.npz"
CASES = load_cases(GOLDENS, OPS)
RNG = np.random.default_rng(5)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernel_matches_reference(case):
    check_kernel(case.node(), case.inputs, rtol=1e-5, atol=1e-6)


CONFIGS = [
    ("MaxPool", {"kernel": [3, 3], "stride": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": True}),
    ("MaxPool", {"kernel": [2, 3], "stride": [1, 2], "pads": [0, 1, 1, 0], "dilation": [2, 1]}),
    ("MaxPool", {"kernel": [3, 3], "stride": [2, 2], "auto_pad": "same_lower"}),
    ("AvgPool", {"kernel": [3, 3], "stride": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": True}),
    ("AvgPool", {"kernel": [3, 2], "stride": [2, 1], "pads": [1, 0, 1, 1], "count_include_pad": False}),
    ("AvgPool", {"kernel": [2, 2], "divisor_override": 3}),
    ("GlobalAvgPool", {}),
    ("GlobalMaxPool", {}),
    ("AdaptiveAvgPool", {"output_size": [3, 2]}),
    ("AdaptiveMaxPool", {"output_size": [4, None]}),
]


@pytest.mark.parametrize("op,params", CONFIGS, ids=lambda v: v if isinstance(v, str) else "")
def test_kernel_built_at_max_runs_smaller(op, params):
    node = make_node(op, 1, params=params)
    check_kernel(node, [rand(1, 3, 7, 6)], [rand(2, 3, 12, 11)])
    check_kernel(node, [rand(2, 3, 12, 11)])


def test_maxpool_propagates_nan_and_handles_float64():
    x = rand(1, 2, 4, 4)
    x[0, 1, 1, 2] = np.nan
    node = make_node("MaxPool", 1, params={"kernel": [2, 2]})
    check_kernel(node, [x])
    assert np.isnan(reference(node, [x])[0][0, 1, 0, 1])
    check_kernel(node, [x.astype(np.float64)])
    check_kernel(make_node("AdaptiveAvgPool", 1, params={"output_size": [3, 3]}), [x.astype(np.float64)])


@pytest.mark.parametrize("op,params", CONFIGS, ids=lambda v: v if isinstance(v, str) else "")
def test_kernels_split_over_threads(monkeypatch, op, params):
    from engine.devices.cpu import threads as _threads
    before = _threads.get_threads()
    monkeypatch.setattr(_threads, "MIN_WORK", 0)
    _threads.set_threads(3)
    try:
        check_kernel(make_node(op, 1, params=params), [rand(2, 5, 9, 8)])
    finally:
        _threads.set_threads(before)


# The separable max-pool kernel: a column max over the window's rows into a -inf padded row, then the row
# max; special-cased loops for 3x3/s2, 3x3/s1 and 2x2/s2. Each geometry below against the numpy reference.
MAXPOOL_GEOMETRIES = [
    ({"kernel": [3, 3], "stride": [2, 2]}, (1, 3, 111, 111)),                             # squeezenet
    ({"kernel": [3, 3], "stride": [2, 2], "ceil_mode": True}, (2, 5, 56, 55)),            # ceil overhang
    ({"kernel": [3, 3], "stride": [2, 2], "pads": [1, 1, 1, 1]}, (2, 3, 112, 113)),       # resnet stem
    ({"kernel": [3, 3], "stride": [1, 1], "pads": [1, 1, 1, 1]}, (1, 7, 9, 10)),
    ({"kernel": [2, 2], "stride": [2, 2], "ceil_mode": True}, (3, 5, 9, 7)),
    ({"kernel": [3, 3], "stride": [2, 2], "pads": [1, 0, 0, 1], "ceil_mode": True}, (1, 3, 8, 9)),
    ({"kernel": [3, 3], "stride": [2, 2], "dilation": [2, 2], "pads": [1, 1, 1, 1]}, (1, 4, 13, 12)),
    ({"kernel": [3, 2], "stride": [1, 3], "dilation": [1, 2], "pads": [1, 1, 1, 1]}, (1, 2, 6, 11)),
    ({"kernel": [5, 4], "stride": [3, 2], "pads": [2, 1, 2, 2], "ceil_mode": True}, (2, 3, 14, 15)),
    ({"kernel": [1, 1], "stride": [2, 2]}, (1, 3, 5, 6)),
    ({"kernel": [3, 3], "stride": [2, 2], "pads": [1, 1, 1, 1]}, (1, 1, 1, 2)),           # one row, one col
    *(TWO_BY_TWO := [
        ({"kernel": [2, 2], "stride": [2, 2]}, (2, 3, 10, 12)),  # windows all inside: the one-pass 2x2 loop
        ({"kernel": [2, 2], "stride": [2, 2]}, (1, 4, 9, 7)),  # ... the last row and column dropped
    ]),
]


@pytest.mark.parametrize("params,shape", MAXPOOL_GEOMETRIES, ids=lambda v: str(v) if isinstance(v, tuple) else "")
def test_maxpool_geometries_match_reference(params, shape):
    node = make_node("MaxPool", 1, params=params)
    check_kernel(node, [rand(*shape)], rtol=0, atol=0)


def test_maxpool_nan_and_inf_at_every_window_position():
    """NaN wins wherever it sits (the vectorised max is branch-free); -inf inputs are kept, not mistaken for pads."""
    x = rand(1, 2, 9, 9)
    x[0, 0, ::2, ::3] = np.nan
    x[0, 0, 3, 7] = np.nan  # the second row and column of a 2x2 window
    x[0, 1] = -np.inf
    x[0, 1, 4, 4] = np.nan
    for params in MAXPOOL_GEOMETRIES[1:8] + TWO_BY_TWO[:1]:  # the 9x9 input: one 2x2 geometry
        node = make_node("MaxPool", 1, params=params[0])
        want = reference(node, [x])[0]
        got = run_kernel(node, [x])[0]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


# Windows of VIA_BLOCKED_MIN_TAPS taps and more run on oneDNN's blocked pooling between two reorders (with oneDNN
# on): SPPF's 5x5 s1, SPP's 13x13, ceil_mode's end pads, channels that fill no whole block.
VIA_BLOCKED = [
    ({"kernel": [5, 5], "stride": [1, 1], "pads": [2, 2, 2, 2]}, (1, 20, 20, 20)),
    ({"kernel": [13, 13], "stride": [1, 1], "pads": [6, 6, 6, 6]}, (2, 9, 20, 19)),
    ({"kernel": [5, 4], "stride": [3, 2], "pads": [2, 1, 2, 2], "ceil_mode": True}, (2, 3, 14, 15)),
    ({"kernel": [4, 4], "stride": [2, 2], "pads": [1, 1, 1, 1]}, (1, 12, 17, 16)),
]


@pytest.mark.skipif(not onednn_objects.available(), reason="oneDNN is not installed")
@pytest.mark.parametrize("params,shape", VIA_BLOCKED, ids=lambda v: str(v) if isinstance(v, tuple) else "")
def test_wide_maxpool_windows_on_the_blocked_primitive(params, shape):
    node = make_node("MaxPool", 1, params=params)
    kernel, workspace = build_kernel(node, infos_of([rand(*shape)]))
    assert kernel.impl.startswith("onednn:reorder+"), kernel.impl
    assert workspace is not None and workspace.nbytes >= 4 * shape[0] * -(-shape[1] // 8) * 8 * shape[2] * shape[3]
    check_kernel(node, [rand(*shape)], rtol=0, atol=0)
    smaller = (max(1, shape[0] - 1), shape[1], shape[2] - 3, shape[3] - 2)  # another shape on the same kernel
    check_kernel(node, [rand(*smaller)], [rand(*shape)], rtol=0, atol=0)
    x = rand(*shape)
    x[0, 0, ::3, ::2] = np.nan
    x[0, -1] = -np.inf
    x[-1, 1, 3, 3] = np.inf
    want, got = reference(node, [x])[0], run_kernel(node, [x])[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])


@pytest.mark.parametrize("pads,stride", [([0, 0, 5, 0], 1), ([0, 0, 0, 5], 2), ([5, 5, 5, 5], 1), ([0, 0, 0, 7], 2)])
def test_wide_windows_oneDNN_cannot_size_keep_the_numba_loop(pads, stride):
    """ceil_mode drops a last window that would start in the end padding; with an end pad of the window or more,
    oneDNN's output size (every pad counted) is not torch's and it refuses the primitive: the numba loop runs, at
    the build shape and at a run-time shape that has the problem when the build shape did not."""
    params = {"kernel": [5, 5], "stride": [stride, stride], "pads": pads, "ceil_mode": True}
    node = make_node("MaxPool", 1, params=params)
    check_kernel(node, [rand(1, 8, 11, 12)], rtol=0, atol=0)
    check_kernel(node, [rand(1, 8, 11, 12)], [rand(2, 8, 23, 24)], rtol=0, atol=0)


def test_narrow_or_dilated_maxpool_windows_keep_the_numba_loop():
    """Nine taps or fewer: the numba loop is as fast; a dilated window: oneDNN has only its reference kernel."""
    for params in ({"kernel": [3, 3], "stride": [1, 1], "pads": [1, 1, 1, 1]}, {"kernel": [2, 2], "stride": [2, 2]},
                   {"kernel": [4, 4], "stride": [2, 2], "dilation": [2, 2], "pads": [1, 1, 1, 1]}):
        node = make_node("MaxPool", 1, params=params)
        kernel, workspace = build_kernel(node, infos_of([rand(1, 16, 20, 20)]))
        assert kernel.impl == "numba:max_pool" and workspace.nbytes == 0
        check_kernel(node, [rand(1, 16, 20, 20)], rtol=0, atol=0)


def test_maxpool_batch_smaller_than_built_and_threads(monkeypatch):
    from engine.devices.cpu import threads as _threads
    node = make_node("MaxPool", 1, params={"kernel": [3, 3], "stride": [2, 2], "ceil_mode": True})
    before = _threads.get_threads()
    monkeypatch.setattr(_threads, "MIN_WORK", 0)
    _threads.set_threads(2)
    try:
        check_kernel(node, [rand(3, 5, 27, 27)], [rand(8, 5, 27, 27)], rtol=0, atol=0)
    finally:
        _threads.set_threads(before)


# The numba AvgPool (separable: rows summed into a zero-padded row, then the taps along it, then the divisors) on
# the geometries where its special cases and clipping meet: constant-tap loops (2x2 s2, 3x3 s1/s2), the generic
# one, windows past the input into the pads and past the pads (ceil_mode), both counting rules, an override.
AVGPOOL_GEOMETRIES = [
    ({"kernel": [3, 3], "stride": [1, 1], "pads": [1, 1, 1, 1]}, (2, 3, 28, 29)),
    ({"kernel": [3, 3], "stride": [1, 1], "pads": [1, 1, 1, 1], "count_include_pad": False}, (1, 2, 9, 30)),
    ({"kernel": [2, 2], "stride": [2, 2]}, (1, 3, 57, 56)),
    ({"kernel": [2, 2], "stride": [2, 2], "ceil_mode": True}, (1, 2, 7, 9)),
    ({"kernel": [3, 3], "stride": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": True}, (2, 2, 10, 11)),
    ({"kernel": [3, 3], "stride": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": True, "count_include_pad": False},
     (1, 2, 10, 8)),
    ({"kernel": [5, 5], "stride": [1, 1], "pads": [2, 2, 2, 2]}, (1, 4, 20, 20)),
    ({"kernel": [7, 4], "stride": [3, 2], "pads": [3, 1, 2, 2], "ceil_mode": True}, (2, 2, 16, 13)),
    ({"kernel": [3, 1], "stride": [1, 1], "pads": [1, 0, 1, 0], "count_include_pad": False}, (1, 2, 6, 5)),
    ({"kernel": [3, 3], "stride": [1, 1], "pads": [1, 1, 1, 1]}, (1, 1, 1, 2)),           # one row: windows of pads
    ({"kernel": [4, 4], "stride": [4, 4], "divisor_override": 5}, (1, 2, 8, 12)),
]


@pytest.mark.parametrize("params,shape", AVGPOOL_GEOMETRIES, ids=lambda v: str(v) if isinstance(v, tuple) else "")
def test_avgpool_geometries_match_reference(params, shape, monkeypatch):
    monkeypatch.setattr(onednn_pool, "jit_pooling", lambda impl: False)  # the numba kernel on every host
    node = make_node("AvgPool", 1, params=params)
    x = rand(*shape) + 2  # sums away from zero: a relative tolerance
    check_kernel(node, [x], rtol=2e-6, atol=0)
    check_kernel(node, [rand(1, shape[1], shape[2] // 2 + 1, shape[3] - 1) + 2], [x], rtol=2e-6, atol=0)


def test_pooling_kernels_keep_arguments_for_a_bounded_number_of_shapes():
    """A stream of new input shapes (each within the max) drops the oldest from the per-shape cache; every result
    stays right."""
    for op in ("MaxPool", "AvgPool"):
        node = make_node(op, 1, params={"kernel": [3, 3], "stride": [2, 2], "pads": [1, 1, 1, 1]})
        big = rand(1, 2, 40, 40)
        fn = build_kernel(node, infos_of([big], node=node))[0]
        for h in range(3, 3 + 2 * cpu_kernel.SHAPES_KEPT):
            x = rand(1, 2, h, 7)
            out = np.empty(reference(node, [x])[0].shape, np.float32)
            fn([x], [out], None)
            np.testing.assert_allclose(out, reference(node, [x])[0], rtol=2e-6, atol=1e-6)
        kept = fn.plans if fn.impl.startswith("onednn:") else fn.shapes  # oneDNN's primitives, or numba's arguments
        assert 0 < len(kept) <= cpu_kernel.SHAPES_KEPT


@pytest.mark.parametrize("shape", [(1, 3, 112, 112), (2, 33, 7, 7), (3, 1, 1, 1), (1, 5, 1, 300), (2, 4, 6)])
def test_global_avgpool_row_sums(shape):
    """The vectorised (reassociated) float32 sum stays within float32 rounding of the float64 reference."""
    x = rand(*shape) + 1
    node = make_node("GlobalAvgPool", 1)
    check_kernel(node, [x], rtol=2e-6, atol=1e-6)
    check_kernel(node, [x.astype(np.float64)], rtol=1e-12, atol=1e-12)
    x.reshape(-1)[0] = np.nan
    assert np.isnan(run_kernel(node, [x])[0].reshape(-1)[0])


def test_onednn_pooling_is_created_for_the_threads_its_work_is_worth(monkeypatch):
    """A pooling of little work is created for one OpenMP thread (created for two it forks both even when run
    under a count of one); a large one for the engine's count. Both still match the reference."""
    from op_harness import build_kernel, infos_of

    from engine.devices.cpu import threads as _threads
    from engine.devices.cpu.onednn import objects as D
    if not D.available():
        pytest.skip("oneDNN is not installed")
    counts: list[int] = []
    create = D.PrimitiveDesc.create

    def spy(cls, name, *args):
        if name.startswith("dnnl_pooling"):
            counts.append(D._local.threads)
        return create(name, *args)
    monkeypatch.setattr(D.PrimitiveDesc, "create", classmethod(spy))
    before = _threads.get_threads()
    _threads.set_threads(2)
    try:
        node = make_node("AvgPool", 1, params={"kernel": [3, 3], "stride": [1, 1], "pads": [1, 1, 1, 1]})
        small, large = rand(1, 8, 6, 6), rand(1, 64, 96, 96)  # 2.6K and 5.3M window reads (FORK_WORK: 4M)
        for x in (small, large):
            build_kernel(node, infos_of([x], node=node))
            check_kernel(node, [x], rtol=1e-5, atol=1e-5)
    finally:
        _threads.set_threads(before)
    assert counts and counts[0] == 1 and counts[-1] == 2, counts


@pytest.mark.parametrize("shape", [(2, 5, 7, 7), (1, 3, 1, 1), (1, 64, 56, 56), (1, 4, 9), (1, 2, 3, 4, 5)])
def test_global_maxpool_float32_lets_every_nan_win(shape):
    """The int-ordered row max (loops/pool.py global_max) against numpy's: exact, a NaN of either sign anywhere in
    a plane makes that plane's max NaN, -inf planes stay -inf, +inf wins; 1-D and 3-D maps too; float64 numpy's."""
    from op_harness import build_kernel, infos_of

    x = rand(*shape) * 100
    planes = x.reshape(shape[0] * shape[1], -1)
    planes[0, -1] = np.nan
    if planes.shape[0] > 3:
        planes[1, 0] = -np.nan
        planes[2] = -np.inf
        planes[3, planes.shape[1] // 2] = np.inf
    node = make_node("GlobalMaxPool", 1)
    assert build_kernel(node, infos_of([x]))[0].impl == "numba:global_max"
    got = run_kernel(node, [x])[0]
    want = x.reshape(shape[0], shape[1], -1).max(axis=2).reshape(got.shape)
    np.testing.assert_array_equal(got, want)
    check_kernel(node, [x.astype(np.float64)])
