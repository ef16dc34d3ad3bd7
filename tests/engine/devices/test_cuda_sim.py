"""Runs the simulated-CUDA test modules (every kernel vs the numpy reference, the device, whole models) in a
child pytest with NUMBA_ENABLE_CUDASIM=1 (see conftest.py for why a child process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SIM_MODULES = ["test_cuda_kernels.py", "test_cuda_device.py", "test_cuda_models.py"]  # as in conftest.py


@pytest.mark.slow
@pytest.mark.timeout(960)  # the child's own bound (900 s) and its start, not the suite's 300 s per test
def test_simulated_cuda():
    """One child for all modules: numba's import dominates a child's start-up."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", *(str(HERE / m) for m in SIM_MODULES), "-q", "-p", "no:cacheprovider",
           "--timeout=600", "-rfE"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    print(done.stdout[-4000:])
    tail = f"{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
    assert done.returncode == 0, f"simulated CUDA tests failed:\n{tail}"
