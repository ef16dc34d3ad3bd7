"""One-thread matmul plans run from several threads at once (engine/devices/cpu/onednn/matmul.py's ThreadPlan and
Runner, what the attention kernel's tile GEMMs use) against numpy; such a run forks no OpenMP team."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from engine.devices.cpu.onednn import matmul as dnn
from engine.devices.cpu.onednn import objects as _onednn

if not _onednn.available():
    pytest.skip("oneDNN (libdnnl.so.3 from the onednn-cpu-gomp wheel) is not installed", allow_module_level=True)

RNG = np.random.default_rng(19)
ROOT = Path(__file__).resolve().parents[5]


def test_strided_operands_match_numpy():
    """a (m, k) read through a row stride wider than k, b as the transpose of a (n, k) array, c rows padded."""
    a_src = RNG.standard_normal((40, 30)).astype(np.float32)
    b_src = RNG.standard_normal((50, 24)).astype(np.float32)
    c = np.zeros((40, 60), np.float32)
    plan = dnn.ThreadPlan.strided(40, 24, 50, (30, 1), (1, 24), (60, 1))
    plan.runner().run(a_src.ctypes.data, b_src.ctypes.data, c.ctypes.data)
    np.testing.assert_allclose(c[:, :50], a_src[:, :24] @ b_src.T, rtol=1e-5, atol=1e-5)
    assert (c[:, 50:] == 0).all()


def test_threads_run_one_plan_at_once_each_with_its_runner():
    plan = dnn.ThreadPlan.strided(64, 32, 48, (32, 1), (48, 1), (48, 1))
    b = RNG.standard_normal((32, 48)).astype(np.float32)
    a = [RNG.standard_normal((64, 32)).astype(np.float32) for _ in range(4)]
    c = [np.empty((64, 48), np.float32) for _ in range(4)]

    def work(i: int) -> None:
        runner = plan.runner()
        for _ in range(50):
            runner.run(a[i].ctypes.data, b.ctypes.data, c[i].ctypes.data)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        np.testing.assert_allclose(c[i], a[i] @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", [None, "AVX2"])
def test_a_run_from_another_thread_forks_no_openmp_team(isa):
    """Created for one thread, the primitive runs inline on the calling thread: the process gains no threads
    (libgomp starts a team's threads on its first parallel region; a primitive created for 4 adds 3), whatever
    that thread's OpenMP count. With oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA) the matmul is gemm:jit, which
    reads the calling thread's OpenMP count at run time, as on hosts without AVX-512: the runner sets it to one."""
    code = textwrap.dedent("""
        import os, threading
        import numpy as np
        from engine.devices.cpu.onednn import binding, matmul as dnn, objects
        assert objects.available()
        binding.OMP.omp_set_num_threads(4)
        plan = dnn.ThreadPlan.strided(256, 64, 512, (64, 1), (1, 64), (512, 1))
        a, b = np.ones((256, 64), np.float32), np.ones((512, 64), np.float32)
        c = np.empty((256, 512), np.float32)
        counts = []
        def run():  # a team's threads live while the thread that forked it does: counted from inside
            binding.OMP.omp_set_num_threads(4)
            counts.append(len(os.listdir("/proc/self/task")))
            plan.runner().run(a.ctypes.data, b.ctypes.data, c.ctypes.data)
            counts.append(len(os.listdir("/proc/self/task")))
        t = threading.Thread(target=run)
        t.start()
        t.join()
        assert (c == 64).all()
        print(plan.impl, *counts)
    """)
    env = {"OMP_NUM_THREADS": "4", "OPENBLAS_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    # where this process found its packages and oneDNN (a PYTHONPATH install, libdnnl on LD_LIBRARY_PATH), so does
    # the child
    env.update({k: os.environ[k] for k in ("PYTHONPATH", "LD_LIBRARY_PATH") if k in os.environ})
    if isa is not None:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    impl, before, after = done.stdout.split()
    if isa is not None:
        assert not impl.startswith("brg"), impl  # the case this run is for: an impl that reads the count
    assert int(after) == int(before), impl
