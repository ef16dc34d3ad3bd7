"""CUDA device tests. numba decides at the first `import numba.cuda` whether it simulates (the choice is cached for
the whole process), so the simulator tests run in a child pytest with NUMBA_ENABLE_CUDASIM=1 launched by
test_cuda_sim.py; the main run never imports them and the CPU tests never see a simulated GPU.
"""

from __future__ import annotations

import os
import sys

import pytest

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
SIM_MODULES = ["test_cuda_kernels.py", "test_cuda_device.py", "test_cuda_models.py"]


def _real_gpu() -> bool:
    """A CUDA device numba can use (never the simulator: this is asked only when the simulator is off)."""
    try:
        from numba import cuda
    except ImportError:  # numba-cuda is in the test extra; without it the gpu tests skip with that reason
        return False
    return bool(cuda.is_available())


def _lock_simulated_shared_arrays() -> None:
    """numba's simulator makes a block's `cuda.shared.array` on the first thread's call: a dict get, np.empty, a
    set, keyed by the caller's line, with no lock. A thread switched out between the get and the set and another
    thread each get an array of their own, and a tiled kernel reads a tile the other half of the block never wrote
    (seen under load as 5 wrong values of a 10x6 Gemm, about once in a thousand runs). The same allocation under a
    lock; the key as the simulator's (file, line of the caller)."""
    import threading

    import numpy as np
    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    original, lock = kernelapi.FakeCUDAShared.array, threading.Lock()

    def array(self, shape, dtype, *args, **kwargs):
        if shape == 0 or args or kwargs:  # dynamic shared memory (one buffer for all), or options: the simulator's
            return original(self, shape, dtype, *args, **kwargs)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            if key not in self._allocations:
                self._allocations[key] = np.empty(shape, dtype)
            return self._allocations[key]

    kernelapi.FakeCUDAShared.array = array


if SIMULATED:
    collect_ignore = ["test_cuda_sim.py", "test_cuda_gpu.py"]
    # The simulator runs each CUDA thread as a Python thread and polls them while holding the GIL; a short
    # switch interval lets the simulated threads reach their barriers ~5x sooner. This is the child process.
    sys.setswitchinterval(0.0005)
    _lock_simulated_shared_arrays()
elif _real_gpu():
    # On a machine with a GPU the simulator's modules run on the device itself, in this process.
    collect_ignore = ["test_cuda_sim.py"]
else:
    collect_ignore = list(SIM_MODULES)


def _root_helpers():
    """tests/conftest.py as a module, for its read_fixture (loaded by path: a plain `import tests.conftest`
    depends on how pytest was started)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "conftest.py"
    spec = importlib.util.spec_from_file_location("_nnserve_root_conftest", path)
    if spec.name not in sys.modules:  # dataclasses look their module up in sys.modules
        sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


@pytest.fixture(scope="session")
def read_fixture():
    """tests/conftest.py's read_fixture(name, kind="pnnx") -> ModelFixture."""
    return _root_helpers().read_fixture


@pytest.fixture(scope="session")
def fixtures_dir():
    return _root_helpers().FIXTURES_DIR
