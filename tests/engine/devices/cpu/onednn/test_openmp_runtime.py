"""Which OpenMP runtime oneDNN's threads (and ours) run on (onednn/binding.py): Intel's, loaded before libdnnl so
that the loader binds libdnnl's GOMP_* / omp_* calls to it, or libgomp. Each case in a process of its own: a
runtime is chosen once per process, when libdnnl loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.devices.cpu.onednn import binding

REPO = Path(__file__).resolve().parents[5]
TESTS = REPO / "tests"

pytestmark = [
    pytest.mark.skipif(binding.load() is None, reason="oneDNN (libdnnl) is not installed"),
    pytest.mark.skipif(not Path(sys.prefix, "lib", binding.INTEL_OPENMP).exists(),
                       reason="Intel's OpenMP (the intel-openmp wheel, an x86-64 Linux dependency) is not installed"),
]

# A 2-thread run of a model whose convs split (oneDNN's regions) and of our kernels on the OpenMP team; prints the
# runtime and how many threads the run added: one runtime's team (the master and one worker), never a second
# runtime's workers beside it. Which library the loader bound libdnnl's imports to, the test reads from the
# loader's own log (LD_DEBUG=bindings).
SCRIPT = """
import ctypes, os, sys
PRELOAD = os.environ.pop("PRELOAD_GOMP", "")
if PRELOAD:
    ctypes.CDLL("libgomp.so.1", mode=os.RTLD_GLOBAL)
import numpy as np
import engine
from engine.devices.cpu import threads
from engine.devices.cpu.onednn import binding
from fixture_models import assert_close_to_torch, cases, max_shapes, model_path
before = len(os.listdir("/proc/self/task"))
try:
    inst = engine.load(model_path("resnet")).instance(max_shapes=max_shapes("resnet"), threads=2)
except Exception as e:
    print("error", type(e).__name__, str(e).replace(" ", "_"))
    sys.exit(0)
feeds, want = cases("resnet")[0]
threads.MIN_WORK = 0  # our kernels split too, on the OpenMP team
for _ in range(3):
    assert_close_to_torch(inst.run(feeds), want)
print("ok", binding.INTEL, len(os.listdir("/proc/self/task")) - before)
"""


def _child_env(**env: str) -> dict[str, str]:
    """This process's environment without OpenMP's wait settings (the suite sets them: tests/conftest.py) or a
    runtime choice, where the fixture helpers import from, and `env`."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "NNSERVE_OPENMP")}
    clean["PYTHONPATH"] = os.pathsep.join([str(TESTS / "engine" / "runtime"), str(REPO), clean.get("PYTHONPATH", "")])
    return {**clean, **env}


def _run(tmp_path: Path, **env: str) -> tuple[list[str], str]:
    """(what the script printed, the libraries the loader bound libdnnl's GOMP_parallel_start to)."""
    clean = _child_env(**env, LD_DEBUG="bindings", LD_DEBUG_OUTPUT=str(tmp_path / "ld"))
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=clean, timeout=240,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    bound = set()
    for log in tmp_path.glob("ld.*"):
        for line in log.read_text(errors="replace").splitlines():
            if "GOMP_parallel_start" in line and "libdnnl.so" in line.split(" to ")[0]:
                bound.add(Path(line.split(" to ")[1].split()[0].strip("`'[]:")).name)
    return done.stdout.split(), ",".join(sorted(bound))


@pytest.mark.parametrize("choice", ["auto", "intel"])
def test_intel_openmp_runs_every_parallel_region_of_the_process(choice, tmp_path):
    """libdnnl's calls bind to Intel's runtime, and a 2-thread run adds one worker thread (libgomp, still mapped as
    libdnnl's dependency, starts none): one set of threads on the cores, not two."""
    out, bound = _run(tmp_path, NNSERVE_OPENMP=choice)
    assert out == ["ok", "True", "1"] and bound == binding.INTEL_OPENMP


def test_gnu_openmp_on_request(tmp_path):
    out, bound = _run(tmp_path, NNSERVE_OPENMP="gnu")
    assert out[:2] == ["ok", "False"] and out[2] in ("0", "1")  # libgomp's worker may predate the count
    assert bound.startswith("libgomp")


def test_libgomp_loaded_first_keeps_onednn_on_it(tmp_path):
    """Another library loaded libgomp into the global scope first: libdnnl would bind to it whatever came later,
    so `auto` stays on libgomp (one runtime, not two) and `intel` is an error saying why."""
    out, bound = _run(tmp_path, PRELOAD_GOMP="1")
    assert out[:2] == ["ok", "False"] and out[2] in ("0", "1") and bound.startswith("libgomp")
    (tmp_path / "intel").mkdir()
    out, _ = _run(tmp_path / "intel", PRELOAD_GOMP="1", NNSERVE_OPENMP="intel")
    assert out[:2] == ["error", "KernelError"] and "was_already_loaded_globally" in out[2]


EVERY_MODEL = """
import numpy as np
import engine
from engine.devices.cpu import threads
from engine.devices.cpu.onednn import binding
from fixture_models import assert_close_to_torch, cases, fixture_names, max_shapes, model_path
done = 0
for name in fixture_names():
    inst = engine.load(model_path(name)).instance(max_shapes=max_shapes(name), threads=2)
    for feeds, want in cases(name):
        for _ in range(2):  # the second run on the spinning team
            assert_close_to_torch(inst.run(feeds), want)
    done += 1
print("ok", binding.INTEL, threads._fork_work == threads.SPINNING_FORK_WORK, threads._guard is not None, done,
      binding.OMP.kmp_get_blocktime())
"""


def test_every_fixture_model_matches_torch_on_the_spinning_team():
    """The default process setup (the suite's own runs have OpenMP's threads sleeping, tests/conftest.py): Intel's
    runtime, 2 threads spinning through requests, primitives split from SPINNING_FORK_WORK, the busy-host guard
    on. Every committed fixture model gives torch's outputs there."""
    out = subprocess.run([sys.executable, "-c", EVERY_MODEL], capture_output=True, text=True, timeout=600, cwd=REPO,
                         env=_child_env())
    assert out.returncode == 0, out.stderr[-3000:]
    status, intel, spinning, guarded, models, blocktime = out.stdout.split()
    assert (status, intel, spinning, guarded) == ("ok", "True", "True", "True") and int(models) >= 20
    # still spinning 20 ms after calm runs (the runtime's unit is microseconds here: KMP_BLOCKTIME=20000us), or 0
    # when this host was busy during the last runs (busy_host.py)
    assert int(blocktime) in (20_000, 0)
