"""CUDA device tests. numba decides at the first `import numba.cuda` whether it simulates (the choice is cached for
the whole process), so the simulator tests run in a child pytest with NUMBA_ENABLE_CUDASIM=1 launched by
test_cuda_sim.py; the main run never imports them and the CPU tests never see a simulated GPU.
"""

from __future__ import annotations

import os
import sys

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
SIM_MODULES = ["test_cuda_kernels.py", "test_cuda_device.py", "test_cuda_models.py"]

if SIMULATED:
    collect_ignore = ["test_cuda_sim.py", "test_cuda_gpu.py"]
    # The simulator runs each CUDA thread as a Python thread and polls them while holding the GIL; a short
    # switch interval lets the simulated threads reach their barriers ~5x sooner. This is the child process.
    sys.setswitchinterval(0.0005)
else:
    collect_ignore = list(SIM_MODULES)
