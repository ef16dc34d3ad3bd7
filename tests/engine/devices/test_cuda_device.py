"""The CUDA device itself on the simulator (run by test_cuda_sim.py): names and placement, one arena and one
workspace allocation per instance, weights uploaded once, pinned staging reused, metrics, threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from numba.core import config as numba_config

import engine
from engine.devices import get_device
from engine.devices.cuda import CudaDevice, device_count
from engine.errors import EngineError


def test_simulator_reports_one_device():
    assert device_count() == 1


@pytest.mark.parametrize("name", ["cuda", "gpu", "cuda:0", "GPU:0"])
def test_device_names(name):
    assert get_device(name).name == "cuda:0"


def test_missing_device_is_a_clear_load_error(read_fixture):
    with pytest.raises(EngineError, match=r"no CUDA device 3 for 'cuda:3'.*only 1 CUDA device"):
        CudaDevice("cuda:3")
    with pytest.raises(EngineError, match="bad CUDA device name"):
        get_device("cuda:first")
    fx = read_fixture("two_inputs")
    with pytest.raises(EngineError, match="no CUDA device 2"):
        engine.load(fx.param).instance("cuda:2")


@pytest.fixture(scope="module")
def instance(read_fixture):
    fx = read_fixture("misc_norm_pool")
    return engine.load(fx.param).instance("cuda:0"), fx


def test_one_arena_and_one_workspace_allocation(instance):
    inst, _ = instance
    plan, dev = inst.memory_plan, inst.device
    assert inst.arena.nbytes == plan.arena_bytes  # a device array, cut from one allocation
    assert dev.arena_bytes == plan.arena_bytes + plan.workspace_bytes
    assert dev.memory_used_bytes == dev.arena_bytes + dev.weights_bytes
    assert dev.weights_bytes > 0
    used = dev.device_memory()
    if numba_config.ENABLE_CUDASIM:
        assert used is None  # the simulator has no driver to ask
    else:  # the same module run on a real GPU: the driver's (used, total)
        assert used is not None and used[1] >= used[0] >= dev.arena_bytes


def test_runs_reuse_weights_and_pinned_buffers(instance):
    inst, fx = instance
    dev = inst.device
    first = inst.run(fx.inputs)
    uploads, staged, ids = len(dev._uploaded), len(dev._pinned), {k: id(v) for k, v in dev._pinned.items()}
    second = inst.run({k: v.copy() for k, v in fx.inputs.items()})
    assert len(dev._uploaded) == uploads and {k: id(v) for k, v in dev._pinned.items()} == ids
    assert 0 < staged <= len(fx.inputs) + len(first)  # one per arena slot (an output may reuse an input's)
    for k in first:
        np.testing.assert_array_equal(first[k], second[k])
        assert first[k] is not second[k]


def test_outputs_are_caller_owned_copies(instance):
    inst, fx = instance
    out = inst.run(fx.inputs)
    snapshot = {k: v.copy() for k, v in out.items()}
    inst.run({k: v * 2 for k, v in fx.inputs.items()})
    for k in out:
        np.testing.assert_array_equal(out[k], snapshot[k])


def test_instance_runs_on_another_thread(instance):
    inst, fx = instance
    want = inst.run(fx.inputs)
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(inst.run(fx.inputs)))
    t.start()
    t.join()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_wrong_input_shape_is_an_engine_error(instance):
    inst, fx = instance
    name = next(iter(fx.inputs))
    with pytest.raises(EngineError):
        inst.run({name: np.zeros((1, 8, 99, 99), np.float32)})


def test_engine_debug_traces_device_values(instance, caplog):
    inst, fx = instance
    inst.debug = 2  # ENGINE_DEBUG=2
    with caplog.at_level("DEBUG", logger="engine.runtime"):
        try:
            inst.run(fx.inputs)
        finally:
            inst.debug = 0
    messages = [r.getMessage() for r in caplog.records]
    nodes = [m for m in messages if " in=" in m]
    stats = [m for m in messages if "mean=" in m]
    assert len(stats) == len(nodes) > 0  # one stats line (read back from the device) per executed node
    assert all("nan" not in s for s in stats)
