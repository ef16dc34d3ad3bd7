"""Tests that need a real CUDA device: the same kernels and a whole model on the GPU. They skip, printing the
reason, when numba.cuda finds no device (this process never enables the simulator; see conftest.py)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import engine


def _gpu_or_skip() -> None:
    try:
        from numba import cuda
    except ImportError as e:
        pytest.skip(f"no CUDA device: numba.cuda is not importable ({e})")
    if not cuda.is_available() or len(cuda.gpus) == 0:
        pytest.skip("no CUDA device: numba.cuda.is_available() is False on this machine")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["misc_conv_resize", "transformer", "resnet"])
def test_model_on_gpu_matches_pytorch(name, read_fixture):
    _gpu_or_skip()
    fx = read_fixture(name)
    inst = engine.load(fx.param).instance("cuda:0", max_shapes=fx.max_shapes)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = inst.run(fx.inputs)
    # small grids are launched on purpose: numba's low-occupancy warning would be log noise for every user
    assert not [w for w in seen if "under-utilization" in str(w.message)], [str(w.message) for w in seen]
    for k, want in fx.expected.items():
        np.testing.assert_allclose(out[k], want, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(want).max())))
    used = inst.device.device_memory()
    assert used is not None and used[0] >= inst.device.arena_bytes


@pytest.mark.gpu
def test_every_gpu_gets_its_own_instance(read_fixture):
    _gpu_or_skip()
    from numba import cuda

    fx = read_fixture("two_inputs")
    model = engine.load(fx.param)
    for i in range(len(cuda.gpus)):
        inst = model.instance(f"cuda:{i}")
        assert inst.device.name == f"cuda:{i}"
        np.testing.assert_allclose(inst.run(fx.inputs)["out0"], fx.expected["out0"], rtol=1e-4, atol=1e-4)
