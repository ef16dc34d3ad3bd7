"""Pooling on oneDNN (engine/devices/cpu/onednn/pool.py) against the numpy references: AvgPool as dispatched (with and
without count_include_pad, ceil_mode, smaller shapes after the max), MaxPool's exactness through the module
directly (the dispatch keeps MaxPool on its numba kernel), and the shapes oneDNN cannot do exactly."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import build_kernel, check_kernel, cpu_device, infer, infos_of, make_node, reference

from engine.devices.cpu import threads
from engine.devices.cpu.onednn import objects as _onednn
from engine.devices.cpu.onednn import pool as _pool_onednn
from engine.ops import pool

if not _onednn.available():
    pytest.skip("oneDNN (libdnnl.so.3 from the onednn-cpu-gomp wheel) is not installed", allow_module_level=True)

RNG = np.random.default_rng(13)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


AVG = {
    "2x2_s2": dict(kernel=(2, 2), stride=(2, 2)),
    "3x3_s1_pad_include": dict(kernel=(3, 3), stride=(1, 1), pads=(1, 1, 1, 1)),
    "3x3_s2_pad_exclude": dict(kernel=(3, 3), stride=(2, 2), pads=(1, 1, 1, 1), count_include_pad=False),
    "3x3_s2_ceil_exclude": dict(kernel=(3, 3), stride=(2, 2), ceil_mode=True, count_include_pad=False),
    "asym_pads": dict(kernel=(2, 3), stride=(1, 2), pads=(0, 1, 1, 1)),
}
MAX = {
    "3x3_s2_pad": dict(kernel=(3, 3), stride=(2, 2), pads=(1, 1, 1, 1)),
    "3x3_s2_ceil": dict(kernel=(3, 3), stride=(2, 2), ceil_mode=True),
    "2x2_dil2": dict(kernel=(2, 2), stride=(1, 1), dilation=(2, 2)),
    "asym_pads_ceil": dict(kernel=(3, 2), stride=(2, 2), pads=(1, 0, 0, 1), ceil_mode=True),
}


@pytest.mark.parametrize("name", AVG)
def test_avgpool_dispatches_to_onednn_where_it_has_a_jit_kernel_and_matches(name):
    node = make_node("AvgPool", 1, params=AVG[name])
    big, small = rand(3, 5, 13, 12), rand(1, 5, 9, 11)
    fn = build_kernel(node, infos_of([big], node=node))[0]
    impl = _pool_onednn._Plan(node, pool.pool_geom(node, big.shape), 0).pd.impl  # "simple_nchw:any" on AVX2
    assert fn.impl == (f"onednn:{impl}" if _pool_onednn.jit_pooling(impl) else "numba:avg_pool")
    check_kernel(node, [big], rtol=1e-5, atol=1e-6)
    check_kernel(node, [small], [big], rtol=1e-5, atol=1e-6)


def test_avgpool_without_a_jit_kernel_takes_the_numba_kernel(monkeypatch):
    monkeypatch.setattr(_pool_onednn, "jit_pooling", lambda impl: False)
    node = make_node("AvgPool", 1, params=AVG["3x3_s1_pad_include"])
    x = rand(2, 5, 13, 12)
    assert build_kernel(node, infos_of([x], node=node))[0].impl == "numba:avg_pool"
    check_kernel(node, [x], rtol=1e-5, atol=1e-6)


@pytest.fixture
def any_kernel(monkeypatch):
    """oneDNN's pooling taken whatever kernel it has but its reference (the module's exactness on every host:
    AVX2 ones get its simple NCHW loops, which the dispatch leaves to numba)."""
    monkeypatch.setattr(_pool_onednn, "jit_pooling", lambda impl: not impl.startswith("ref"))


def run_direct(node, x, max_x):
    fallback = build_kernel(node, infos_of([max_x], node=node))[0]
    fn = _pool_onednn.build(node, infos_of([max_x], node=node), pool.pool_geom, fallback)
    out = np.full(infer(node, [x])[0].shape, np.nan, np.float32)
    fn([x], [out], None)
    return fn, out


@pytest.mark.parametrize("name", MAX)
def test_maxpool_module_is_exact(name, any_kernel):
    node = make_node("MaxPool", 1, params=MAX[name])
    big = rand(2, 4, 15, 14)
    for x in (big, rand(1, 4, 10, 9)):
        fn, out = run_direct(node, x, big)
        np.testing.assert_array_equal(out, reference(node, [x])[0])
    if "dilation" in MAX[name]:  # oneDNN has only its reference kernel for dilated pooling: the numba one runs
        assert fn.impl == "numba:max_pool"
    else:
        assert all(p is not None for p in fn.plans.values())


def test_include_pad_with_ceil_padding_keeps_the_numba_kernel():
    # torch clips this divisor at the declared pads; oneDNN would count the ceil_mode extension too
    node = make_node("AvgPool", 1, params=dict(kernel=(3, 3), stride=(2, 2), pads=(1, 1, 1, 1), ceil_mode=True))
    x = rand(1, 3, 8, 8)  # (8 + 2 - 3) / 2 rounds up: the last window reaches past the pad
    assert not _pool_onednn.supported(node, infos_of([x], node=node), pool.pool_geom)
    assert build_kernel(node, infos_of([x], node=node))[0].impl == "numba:avg_pool"
    check_kernel(node, [x], rtol=1e-5, atol=1e-6)


def test_shapes_oneDNN_cannot_do_run_the_fallback(any_kernel):
    # exact at the max shape (no ceil extension at 9x9), not at 8x8: that size takes the numba kernel
    node = make_node("AvgPool", 1, params=dict(kernel=(3, 3), stride=(2, 2), pads=(1, 1, 1, 1), ceil_mode=True))
    big, small = rand(2, 3, 9, 9), rand(1, 3, 8, 8)
    fn, out = run_direct(node, small, big)
    np.testing.assert_allclose(out, reference(node, [small])[0], rtol=1e-5, atol=1e-6)
    assert fn.plans[small.shape] is None and fn.plans[big.shape] is not None


def test_divisor_override_keeps_the_numba_kernel():
    node = make_node("AvgPool", 1, params=dict(kernel=(2, 2), stride=(2, 2), divisor_override=3))
    x = rand(1, 2, 6, 6)
    assert not _pool_onednn.supported(node, infos_of([x], node=node), pool.pool_geom)
    check_kernel(node, [x], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["first", "second share", "middle", "last"])
def test_a_large_pooling_input_is_checked_in_every_share(value, where, monkeypatch):
    """has_not_finite splits a float32 read worth splitting over the team (a native region, each thread its shares):
    a NaN or an infinity is found in whichever share it sits, with 2 and 3 threads; a finite input reads clean."""
    cpu_device()  # oneDNN and its OpenMP loaded, as for any model
    ran = []
    native = _pool_onednn.run_native
    monkeypatch.setattr(_pool_onednn, "run_native", lambda fn, data: ran.append(1) or native(fn, data))
    x = np.ones(1 << 22, np.float32)  # 16 MB: split wherever the team runs native regions
    assert not _pool_onednn.has_not_finite(x)
    assert ran or not threads.native_regions()
    before = threads.get_threads()
    for count in (2, 3):
        threads.set_threads(count)
        try:
            n = x.shape[0]
            at = {"first": 0, "second share": n // count, "middle": n // 2, "last": n - 1}[where]
            x[at] = value
            assert _pool_onednn.has_not_finite(x), (count, at)
            x[at] = 1
            assert not _pool_onednn.has_not_finite(x)
        finally:
            threads.set_threads(before)
    monkeypatch.setattr(_pool_onednn, "run_native", lambda fn, data: False)  # the team busy: one thread
    x[-1] = value
    assert _pool_onednn.has_not_finite(x)
