"""Per-shape caches of the CPU kernels stay bounded (kernel.remember): traffic of ever new input shapes, each
within the max shape, must not grow a kernel's geometry, taps or oneDNN primitives without bound; results stay
right when an evicted shape comes back."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import build_kernel, infer, infos_of, make_node, reference

from engine.devices.cpu import kernel as cpu_kernel
from engine.devices.cpu.onednn import matmul as dnn
from engine.devices.cpu.onednn import objects as D

RNG = np.random.default_rng(3)


def test_remember_drops_the_oldest_entry_first():
    cache: dict = {}
    for i in range(10):
        assert cpu_kernel.remember(cache, i, -i, keep=4) == -i
    assert list(cache) == [6, 7, 8, 9] and cache[9] == -9


def test_shape_cache_drops_the_least_recently_used():
    """oneDNN's primitives sit in a ShapeCache: a hit moves its key to the end, so a working set of `keep` shapes
    used in turn is never re-created."""
    cache = cpu_kernel.ShapeCache()
    for i in range(4):
        cpu_kernel.remember(cache, i, -i, keep=4)
    assert cache.get(0) == 0 and cache.get(9) is None and cache.get(9, "none") == "none"
    cpu_kernel.remember(cache, 4, -4, keep=4)
    assert list(cache) == [2, 3, 0, 4]  # 1, the least recently used, went
    for _ in range(3):  # four shapes in turn: every one a hit
        for k in (2, 3, 0, 4):
            assert cache.get(k) == -k
    assert len(cache) == 4


@pytest.mark.skipif(not D.available(), reason="oneDNN (the onednn-cpu-gomp wheel) is not installed")
def test_gemm_plans_are_bounded_and_stay_right():
    w = RNG.standard_normal((24, 16)).astype(np.float32)
    b = RNG.standard_normal(24).astype(np.float32)
    gemm = dnn.Gemm(w, b, None, False)
    for m in [*range(1, 2 * cpu_kernel.SHAPES_KEPT + 3), 1, 5]:  # 1 and 5 come back after their eviction
        x = RNG.standard_normal((m, 16)).astype(np.float32)
        out = np.empty((m, 24), np.float32)
        gemm.run(x, None, out, None)
        np.testing.assert_allclose(out, x @ w.T + b, rtol=1e-5, atol=1e-5)
        assert len(gemm.plans) <= cpu_kernel.SHAPES_KEPT


def test_conv_kernel_plans_are_bounded_and_stay_right():
    node = make_node("Conv", 1, params={"pads": (1, 1, 1, 1)},
                     attrs={"weight": RNG.standard_normal((8, 4, 3, 3)).astype(np.float32),
                            "bias": RNG.standard_normal(8).astype(np.float32)})
    big = RNG.standard_normal((1, 4, 80, 9)).astype(np.float32)
    fn, ws = build_kernel(node, infos_of([big]))
    for h in [*range(2, cpu_kernel.SHAPES_KEPT + 12), 2]:
        x = RNG.standard_normal((1, 4, h, 9)).astype(np.float32)
        out = np.empty(infer(node, [x])[0].shape, np.float32)
        fn([x], [out], ws)
        np.testing.assert_allclose(out, reference(node, [x])[0], rtol=1e-4, atol=1e-4)
        if D.available():  # oneDNN's path: a primitive per input shape
            assert fn.impl.startswith("onednn:") and len(fn.plans) <= cpu_kernel.SHAPES_KEPT
