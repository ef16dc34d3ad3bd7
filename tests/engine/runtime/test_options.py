"""Settings: the environment is read in one place (EngineOptions.from_env / CpuOptions.from_env, the variables and
defaults of engine/runtime/options.py and engine/devices/cpu/options.py) when an instance is made without options;
options passed in win, and an instance keeps what it was made with."""

from __future__ import annotations

import re

import numpy as np
import pytest
from graphs import tile_sum_expected, tile_sum_graph

from engine.devices.cpu import CpuOptions, blas
from engine.devices.cpu import threads as _threads
from engine.devices.cpu.device import CpuDevice
from engine.devices.cpu.onednn import binding
from engine.errors import EngineError
from engine.runtime.model import Model
from engine.runtime.options import EngineOptions, environment_options


def test_defaults_without_any_variable():
    assert EngineOptions.from_env({}) == EngineOptions(debug=0, cpu=CpuOptions())
    assert CpuOptions() == CpuOptions(onednn=True, layout="blocked", winograd=True, blas="auto", threads=None)


@pytest.mark.parametrize("environ, want", [
    ({"NNSERVE_ONEDNN": "0"}, {"onednn": False}),
    ({"NNSERVE_ONEDNN": " 0 "}, {"onednn": False}),
    ({"NNSERVE_ONEDNN": "1"}, {"onednn_required": True}),
    ({"NNSERVE_LAYOUT": "nchw"}, {"layout": "nchw"}),
    ({"NNSERVE_LAYOUT": " NCHW"}, {"layout": "nchw"}),
    ({"NNSERVE_LAYOUT": "blocked"}, {}),
    ({"NNSERVE_WINOGRAD": "0"}, {"winograd": False}),
    ({"NNSERVE_WINOGRAD": "1"}, {}),
    ({"NNSERVE_BLAS": "numpy"}, {"blas": "numpy"}),
    ({"NNSERVE_BLAS": "OpenBLAS"}, {"blas": "numpy"}),
    ({"NNSERVE_BLAS": "mkl"}, {"blas": "mkl"}),
    ({"NNSERVE_NUM_THREADS": "1024"}, {"threads": 1024}),
    ({"NNSERVE_SPIN_US": "1000000"}, {"spin_us": 1_000_000}),
    ({"NNSERVE_NUM_THREADS": "3"}, {"threads": 3}),
    ({"NNSERVE_NUM_THREADS": "0"}, {}),
    ({"NNSERVE_NUM_THREADS": " "}, {}),
    ({"NNSERVE_SPIN_US": "0"}, {"spin_us": 0}),
    ({"NNSERVE_SPIN_US": "200"}, {"spin_us": 200}),
])
def test_cpu_variables(environ, want):
    assert CpuOptions.from_env(environ) == CpuOptions(**want)


@pytest.mark.parametrize("environ, want", [
    ({"NNSERVE_WAIT_POLICY": "run"}, {}),  # the default
    ({"NNSERVE_WAIT_POLICY": " Short "}, {"wait": "short"}),
    ({"NNSERVE_WAIT_POLICY": ""}, {}),
    ({"NNSERVE_RUN_SPIN_US": "300"}, {"run_spin_us": 300}),
])
def test_wait_policy_variables(environ, want):
    assert CpuOptions.from_env(environ) == CpuOptions(**want)


@pytest.mark.parametrize("environ, message", [
    ({"NNSERVE_WAIT_POLICY": "spin"}, "NNSERVE_WAIT_POLICY='spin': expected one of short, run"),
    ({"NNSERVE_RUN_SPIN_US": "-5"}, "NNSERVE_RUN_SPIN_US='-5': expected a whole number"),
])
def test_wait_policy_typos_are_errors(environ, message):
    # a policy nobody runs is worse than a refusal: the server does not start with a misspelt one
    with pytest.raises(ValueError, match=re.escape(message)):
        CpuOptions.from_env(environ)


@pytest.mark.parametrize("environ, message", [
    ({"NNSERVE_NUM_THREADS": "two"}, "NNSERVE_NUM_THREADS='two': expected a whole number of threads"),
    ({"NNSERVE_NUM_THREADS": "-1"}, "NNSERVE_NUM_THREADS='-1': expected a whole number of threads"),
    ({"NNSERVE_ONEDNN": "off"}, "NNSERVE_ONEDNN='off': expected one of 0, 1"),
    ({"NNSERVE_WINOGRAD": "yes"}, "NNSERVE_WINOGRAD='yes': expected one of 0, 1"),
    ({"NNSERVE_LAYOUT": "nhwc"}, "NNSERVE_LAYOUT='nhwc': expected one of blocked, nchw"),
    ({"NNSERVE_BLAS": "blis"}, "NNSERVE_BLAS='blis': expected one of auto, mkl, numpy, openblas"),
    ({"NNSERVE_SPIN_US": "2us"}, "NNSERVE_SPIN_US='2us': expected a whole number of microseconds"),
    # str.isdigit takes these; int() then fails on one and reads the other as 3
    ({"NNSERVE_NUM_THREADS": "\u00b2"}, "NNSERVE_NUM_THREADS='\u00b2': expected a whole number of threads"),
    ({"NNSERVE_NUM_THREADS": "\u0663"}, "NNSERVE_NUM_THREADS='\u0663': expected a whole number of threads"),
    # a pool of 100k threads, a spin libgomp refuses (it then spins its own default), a count int() cannot read
    ({"NNSERVE_NUM_THREADS": "100000"}, "NNSERVE_NUM_THREADS='100000': expected a whole number of threads (0: the "
                                        "CPUs the process may use, at most 8), at most 1024"),
    ({"NNSERVE_SPIN_US": "99999999999999999999999"}, "at most 1000000"),
    ({"NNSERVE_RUN_SPIN_US": "9" * 5000}, "NNSERVE_RUN_SPIN_US="),
])
def test_cpu_typos_are_errors(environ, message):
    # as for the wait policy: an invalid value stops the server (and the engine) with the variable and what it takes
    with pytest.raises(ValueError, match=re.escape(message)):
        CpuOptions.from_env(environ)
    with pytest.raises(ValueError, match=re.escape(message)):
        EngineOptions.from_env({"ENGINE_DEBUG": "1", **environ})


@pytest.mark.parametrize("value, debug", [("", 0), ("0", 0), ("1", 1), ("2", 2), ("yes", 1)])
def test_engine_debug(value, debug):
    assert EngineOptions.from_env({"ENGINE_DEBUG": value}).debug == debug


@pytest.fixture
def restore_threads():
    before = _threads.get_threads()
    yield
    _threads.set_threads(before)


def test_an_instance_reads_the_environment_once_when_made(monkeypatch, toys, restore_threads):
    monkeypatch.setenv("ENGINE_DEBUG", "2")
    monkeypatch.setenv("NNSERVE_NUM_THREADS", "3")
    assert environment_options() == EngineOptions(debug=2, cpu=CpuOptions(threads=3))
    inst = Model(tile_sum_graph(), "toy").instance(max_shapes={"x": (1, 256)})
    assert inst.debug == 2 and inst.options.cpu.threads == 3 and inst.device.options.threads == 3
    monkeypatch.setenv("ENGINE_DEBUG", "0")  # read once: the instance keeps its setting
    assert inst.debug == 2
    x = np.ones((1, 256), np.float32)
    np.testing.assert_array_equal(inst.run({"x": x})["y"], tile_sum_expected(x)["y"])


def test_options_passed_in_win_over_the_environment(monkeypatch, toys):
    monkeypatch.setenv("ENGINE_DEBUG", "2")
    options = EngineOptions(debug=0, cpu=CpuOptions(onednn=False))
    inst = Model(tile_sum_graph(), "toy").instance(max_shapes={"x": (1, 256)}, options=options)
    assert inst.debug == 0 and inst.device.options is options.cpu and not inst.device.backends.onednn


def test_asked_for_libraries_missing_are_errors(monkeypatch):
    """NNSERVE_ONEDNN=1 and NNSERVE_BLAS=mkl ask for a library: without it the device is not made (unset, a missing
    oneDNN is a warning and MKL is simply not used)."""
    monkeypatch.setattr(binding, "load", lambda *a, **k: None)
    monkeypatch.setattr(blas, "_mkl", lambda: None)
    with pytest.raises(EngineError, match=re.escape("NNSERVE_ONEDNN=1 asks for oneDNN")):
        CpuDevice(CpuOptions.from_env({"NNSERVE_ONEDNN": "1"}))
    with pytest.raises(EngineError, match=re.escape("NNSERVE_BLAS=mkl asks for MKL's sgemm") + ".*`fast` extra"):
        CpuDevice(CpuOptions.from_env({"NNSERVE_BLAS": "mkl"}))
    device = CpuDevice(CpuOptions.from_env({}))
    assert not device.backends.onednn and device.backends.blas.backend == "numpy"
