"""Thread count: NNSERVE_NUM_THREADS, the cgroup CPU quota, BLAS kept to one thread (threadpoolctl), an instance's
own `threads=` applied while it runs (outputs still match PyTorch's)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fixture_models import assert_close_to_torch, cases, max_shapes, model_path
from threadpoolctl import threadpool_info

import engine
from engine.devices.cpu import threads as _threads
from engine.devices.cpu.options import DEFAULT_RUN_SPIN_US, DEFAULT_SPIN_US, CpuOptions, WaitPolicy


@pytest.fixture
def restore_threads():
    before = _threads.get_threads()
    yield
    _threads.set_threads(before)


def _blas_threads() -> set[int]:
    return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


@pytest.mark.parametrize("text, want", [("max 100000\n", None), ("150000 100000\n", 2), ("50000 100000", 1),
                                        ("400000 100000", 4), ("garbage", None), ("100000 0", None)])
def test_cgroup_quota_parsed(tmp_path, text, want):
    f = tmp_path / "cpu.max"
    f.write_text(text)
    assert _threads.cgroup_cpus(f, tmp_path / "no-v1") == want


@pytest.mark.parametrize("quota, period, want", [("-1\n", "100000\n", None), ("200000\n", "100000\n", 2),
                                                 ("150000", "100000", 2), ("50000", "100000", 1), ("x", "1", None)])
def test_cgroup_v1_quota_read_where_there_is_no_cpu_max(tmp_path, quota, period, want):
    # a cgroup v1 node (no cpu.max): a Kubernetes CPU limit is cpu.cfs_quota_us / cpu.cfs_period_us there
    v1 = tmp_path / "cpu"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text(quota)
    (v1 / "cpu.cfs_period_us").write_text(period)
    assert _threads.cgroup_cpus(tmp_path / "absent", v1) == want


def test_missing_cgroup_file_means_unlimited(tmp_path):
    assert _threads.cgroup_cpus(tmp_path / "absent", tmp_path / "absent-v1") is None


def test_env_setting_wins(monkeypatch):
    setting = CpuOptions.from_env({"NNSERVE_NUM_THREADS": "3"}).threads
    assert setting == 3 and _threads.default_threads(setting) == 3
    setting = CpuOptions.from_env({"NNSERVE_NUM_THREADS": "0"}).threads
    monkeypatch.setattr(_threads, "cgroup_cpus", lambda path=None: 1)
    assert setting is None and _threads.default_threads(setting) == 1  # 0 (or unset): the quota-capped CPU count
    with pytest.raises(ValueError, match="NNSERVE_NUM_THREADS='zero'"):  # a bad setting: an error, not the default
        CpuOptions.from_env({"NNSERVE_NUM_THREADS": "zero"})


def test_the_default_count_stops_at_eight_cpus(monkeypatch):
    # past 8 threads a 16-core machine ran slower (threads.DEFAULT_MAX_THREADS); a setting still goes past it
    monkeypatch.setattr(_threads, "cgroup_cpus", lambda path=None: None)
    monkeypatch.setattr(_threads.os, "sched_getaffinity", lambda pid: set(range(16)))
    assert _threads.available_cpus() == 16 and _threads.default_threads(None) == _threads.DEFAULT_MAX_THREADS == 8
    assert _threads.default_threads(12) == 12
    monkeypatch.setattr(_threads.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert _threads.default_threads(None) == 3


def test_blas_stays_single_threaded_under_the_pool(restore_threads):
    """The pool splits GEMMs itself: BLAS threads beside it would oversubscribe the cores."""
    _threads.set_threads(2)
    assert _threads.get_threads() == 2 and _blas_threads() == {1}


def test_instance_threads_applied_per_run(restore_threads):
    name = "resnet"
    model = engine.load(model_path(name))
    one = model.instance(max_shapes=max_shapes(name), threads=1)
    assert _threads.get_threads() == 1
    _threads.set_threads(2)
    feeds, want = cases(name)[0]
    assert_close_to_torch(one.run(feeds), want)
    assert _threads.get_threads() == 1 and _blas_threads() == {1}  # the instance's own count while it runs


def test_instance_without_a_count_keeps_the_one_it_was_built_under(restore_threads):
    """An instance built without threads= runs on the process's count at its build, not on a larger one another
    instance set later: its oneDNN primitives were created for that count and must not run on more threads."""
    name = "resnet"
    model = engine.load(model_path(name))
    model.instance(max_shapes=max_shapes(name), threads=1)
    default = model.instance(max_shapes=max_shapes(name))  # built while the count is 1
    assert default.threads == 1
    model.instance(max_shapes=max_shapes(name), threads=2)
    assert _threads.get_threads() == 2
    feeds, want = cases(name)[0]
    assert_close_to_torch(default.run(feeds), want)
    assert _threads.get_threads() == 1


# -- wait policy: spin a while, then sleep ------------------------------------------------------------
def test_spin_setting_read_from_the_environment():
    assert CpuOptions.from_env({}).spin_us == DEFAULT_SPIN_US
    assert CpuOptions.from_env({"NNSERVE_SPIN_US": "0"}).spin_us == 0
    assert CpuOptions.from_env({"NNSERVE_SPIN_US": " 500 "}).spin_us == 500
    with pytest.raises(ValueError, match="NNSERVE_SPIN_US='-3': expected a whole number"):
        CpuOptions.from_env({"NNSERVE_SPIN_US": "-3"})


def test_default_spin_is_a_few_microseconds():
    """The default spin stays within a few microseconds: a longer one made an instance on a VM fall into a lasting
    slow regime after an idle pause, and loses on a busy host (threads.py, bench/RESULTS.md "Wait policy"). The
    bound in OpenMP's polls is what libgomp gets."""
    assert 1 <= DEFAULT_SPIN_US <= 5
    polls = _threads.gomp_spincount(DEFAULT_SPIN_US)
    assert 0 < polls * _threads.poll_ns() <= 5_000 * 1.01


def test_openmp_gets_the_same_bound_unless_the_user_chose_one():
    from engine.devices.cpu.onednn.binding import openmp_wait_policy

    assert openmp_wait_policy(0, {}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    spin = openmp_wait_policy(200, {})
    assert list(spin) == ["GOMP_SPINCOUNT"] and int(spin["GOMP_SPINCOUNT"]) == _threads.spin_polls(200) > 0
    assert openmp_wait_policy(200, {"OMP_WAIT_POLICY": "ACTIVE"}) == {}
    assert openmp_wait_policy(0, {"GOMP_SPINCOUNT": "10"}) == {}
    # Intel's OpenMP gets its blocktime beside libgomp's count; a user's KMP_BLOCKTIME keeps both untouched
    both = openmp_wait_policy(200, {}, 20_000)
    assert both == {"GOMP_SPINCOUNT": spin["GOMP_SPINCOUNT"], "KMP_BLOCKTIME": "20000us"}
    assert openmp_wait_policy(0, {}, 0) == {"OMP_WAIT_POLICY": "PASSIVE"}  # both runtimes sleep at once
    # each runtime's own variable is the user's to keep; OMP_WAIT_POLICY speaks for both
    assert openmp_wait_policy(200, {"KMP_BLOCKTIME": "1"}, 20_000) == {"GOMP_SPINCOUNT": spin["GOMP_SPINCOUNT"]}
    assert openmp_wait_policy(200, {"GOMP_SPINCOUNT": "1"}, 20_000) == {"KMP_BLOCKTIME": "20000us"}
    assert openmp_wait_policy(200, {"OMP_WAIT_POLICY": "active"}, 20_000) == {}


def test_a_child_process_does_not_take_the_engines_variables_for_its_users():
    """The variables an engine set (and listed) reach a child process with the environment; there they are still
    the engine's, not the user's, unless the user changed them since."""
    from engine.devices.cpu.onednn.binding import SET_BY_ENGINE, openmp_wait_policy, users_environ

    parent = {"PATH": "/bin", "KMP_BLOCKTIME": "20000us", "GOMP_SPINCOUNT": "4048",
              SET_BY_ENGINE: "KMP_BLOCKTIME=20000us;GOMP_SPINCOUNT=4048"}
    assert users_environ(parent) == {"PATH": "/bin"}
    assert openmp_wait_policy(2, users_environ(parent), 2) == {"GOMP_SPINCOUNT": str(_threads.spin_polls(2)),
                                                                "KMP_BLOCKTIME": "2us"}  # the child's own policy
    changed = {**parent, "KMP_BLOCKTIME": "5"}  # the user's since
    assert users_environ(changed) == {"PATH": "/bin", "KMP_BLOCKTIME": "5"}


def test_intel_openmp_spins_through_a_request_only_under_the_run_policy():
    """`run`: Intel's threads wait the spin cap (20 ms: through the Python and one-thread ops of a request) and
    primitives split from SPINNING_FORK_WORK; `short`, libgomp (no blocktime) or the user's own policy (None): they
    sleep between ops and small primitives keep one thread (FORK_WORK)."""
    assert WaitPolicy("run").intel_blocktime_us == 20_000 and WaitPolicy("short", 2).intel_blocktime_us == 2
    assert WaitPolicy("run", 2, 0).intel_blocktime_us == 0  # NNSERVE_RUN_SPIN_US=0: sleep at once
    assert _threads.fork_work(WaitPolicy("run"), 20) == _threads.SPINNING_FORK_WORK < _threads.FORK_WORK
    for policy, blocktime in [(WaitPolicy("run"), None), (WaitPolicy("run"), 0), (WaitPolicy("short"), 20)]:
        assert _threads.fork_work(policy, blocktime) == _threads.FORK_WORK


def test_openmp_runtime_read_from_the_environment():
    assert CpuOptions.from_env({}).openmp == "auto"
    assert CpuOptions.from_env({"NNSERVE_OPENMP": " GNU "}).openmp == "gnu"
    with pytest.raises(ValueError, match="NNSERVE_OPENMP"):
        CpuOptions.from_env({"NNSERVE_OPENMP": "llvm"})


def test_wait_policy_read_from_the_environment():
    assert CpuOptions.from_env({}).wait_policy == WaitPolicy("run", DEFAULT_SPIN_US, DEFAULT_RUN_SPIN_US)
    assert CpuOptions.from_env({"NNSERVE_WAIT_POLICY": " Run "}).wait_policy.mode == "run"
    with pytest.raises(ValueError, match="NNSERVE_WAIT_POLICY"):  # unknown: an error, not a silent default
        CpuOptions.from_env({"NNSERVE_WAIT_POLICY": "spin"})
    policy = CpuOptions.from_env({"NNSERVE_WAIT_POLICY": "run", "NNSERVE_RUN_SPIN_US": "50", "NNSERVE_SPIN_US": "3"})
    assert (policy.run_spin_us, policy.spin_us) == (50, 3)
    with pytest.raises(ValueError, match="NNSERVE_RUN_SPIN_US"):
        CpuOptions.from_env({"NNSERVE_RUN_SPIN_US": "x"})


def test_openmp_spins_the_policy_bound():
    """`short`: OpenMP's threads spin as long as ours; `run`: long enough to bridge the gap between two ops."""
    from engine.devices.cpu.onednn.binding import openmp_wait_policy

    assert WaitPolicy("short", 2, 100).openmp_spin_us == 2
    assert WaitPolicy("run", 2, 100).openmp_spin_us == 100
    spin = openmp_wait_policy(WaitPolicy("run", 2, 100).openmp_spin_us, {})
    assert int(spin["GOMP_SPINCOUNT"]) == _threads.spin_polls(100) > _threads.spin_polls(2)
    assert openmp_wait_policy(WaitPolicy("run", 2, 0).openmp_spin_us, {}) == {"OMP_WAIT_POLICY": "PASSIVE"}


@pytest.mark.parametrize("policy, openmp, kind", [
    (WaitPolicy("run"), True, "openmp"), (WaitPolicy("run"), False, "spin"), (WaitPolicy("short"), True, "spin"),
    (WaitPolicy(), True, "openmp")])  # the default policy is `run`
def test_one_pool_under_the_run_policy_once_openmp_is_loaded(policy, openmp, kind):
    assert _threads.pool_kind(policy, openmp) == kind


def test_every_chunk_has_one_openmp_thread():
    from engine.devices.cpu.openmp_pool import chunk_indices

    for team in range(1, 5):
        for chunks in range(10):
            got = sorted(i for t in range(team) for i in chunk_indices(t, team, chunks))
            assert got == list(range(chunks))


def test_spin_through_a_run_stops_at_the_change_the_park_the_grace_or_the_cap():
    import numpy as np

    from engine.devices.cpu.loops.spin import spin_while_running

    word, park, active = np.zeros(8, np.int64), np.zeros(8, np.int64), np.zeros(8, np.int64)
    word[0] = 1
    assert spin_while_running(word, 0, park, active, 10, 1000)  # the word changed: work to do
    word[0] = 0
    assert not spin_while_running(word, 0, park, active, 10, 10**12)  # no run in progress: the grace ends it
    active[0] = 1
    assert not spin_while_running(word, 0, park, active, 10, 1000)  # a run in progress: the cap ends it
    park[0] = 1
    assert not spin_while_running(word, 0, park, active, 10, 10**12)  # parked: at once


def test_running_counts_runs_in_progress():
    assert _threads.ACTIVE[0] == 0
    with _threads.running():
        with _threads.running():
            assert _threads.ACTIVE[0] == 2
        assert _threads.ACTIVE[0] == 1
    with pytest.raises(RuntimeError), _threads.running():
        raise RuntimeError("a failed run")
    assert _threads.ACTIVE[0] == 0


def _fill(out, value, lo, hi):
    out[lo:hi] = value


def _fail(lo, hi):
    if lo > 0:
        raise ValueError(f"chunk {lo}")


@pytest.mark.parametrize("spin_us", [0, 200, 5000])
def test_pool_runs_every_chunk_once_then_sleeps(restore_threads, spin_us):
    import numpy as np

    _threads.set_threads(3)
    before = _threads.get_spin()
    _threads.set_spin(spin_us)
    try:
        out = np.zeros(1000, np.int64)
        for i in range(200):  # back to back: the workers are caught spinning (or woken, with spin 0)
            _threads.parallel_for(_fill, out.size, 1 << 20, out, i)
            assert (out == i).all()
        with pytest.raises(ValueError, match="chunk"):
            _threads.parallel_for(_fail, 9, 1 << 20)
        _threads.parallel_for(_fill, out.size, 1 << 20, out, -1)  # still usable after a failed chunk
        assert (out == -1).all()
    finally:
        _threads.set_spin(before)


def _fail_all(lo, hi):
    raise ValueError(f"chunk {lo}")


def test_pool_error_of_a_helper_not_raised_again_after_the_callers_own_chunk_failed(restore_threads):
    """Every chunk fails, the caller's own first: the helpers' errors are taken with it, not left for the next,
    valid call (of any model: the pool is the process's) to raise."""
    import numpy as np

    _threads.set_threads(3)
    with pytest.raises(ValueError, match="chunk"):
        _threads.parallel_for(_fail_all, 9, 1 << 20)
    out = np.zeros(1000, np.int64)
    _threads.parallel_for(_fill, out.size, 1 << 20, out, 7)
    assert (out == 7).all()


def _check_pool(pool) -> None:
    import numpy as np

    out = np.zeros(1000, np.int64)
    bounds = [(i * 100, (i + 1) * 100) for i in range(10)]
    for i in range(200):
        assert pool.run(_fill, (out, i), bounds)
        assert (out == i).all()
    with pytest.raises(ValueError, match="chunk"):
        pool.run(_fail, (), [(0, 1), (1, 2), (2, 3)])
    assert pool.run(_fill, (out, -1), bounds)  # still usable after a failed chunk
    assert (out == -1).all()


def test_pool_spinning_through_runs_runs_every_chunk_once_and_then_sleeps():
    """The `run` policy without oneDNN: our workers spin while a run is in progress, sleep after its grace."""
    import time

    pool = _threads.SpinPool(2, 100, through_runs=True)
    try:
        with _threads.running():
            _check_pool(pool)
        _check_pool(pool)
        deadline = time.monotonic() + 60  # the grace is 100 us, the cap 20 ms: a liveness bound, not a timing one
        while not all(pool.asleep) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(pool.asleep)
    finally:
        pool.close()


def test_openmp_pool_runs_every_chunk_once_on_openmps_team():
    from engine.devices.cpu.onednn import binding
    from engine.devices.cpu.openmp_pool import OpenMPPool

    assert binding.load() is not None  # oneDNN is a dependency
    _check_pool(OpenMPPool(binding.OMP, 3))  # the runtime libdnnl's calls bind to
    _check_pool(OpenMPPool(binding.OMP, 1))


def _in_threads(caller, n: int) -> None:
    """caller(0) .. caller(n - 1), each on a thread of its own, all started before any is joined."""
    import threading

    ts = [threading.Thread(target=caller, args=(k,)) for k in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def test_openmp_pool_lets_a_concurrent_caller_run_alone():
    import numpy as np

    from engine.devices.cpu.onednn import binding
    from engine.devices.cpu.openmp_pool import OpenMPPool

    assert binding.load() is not None
    pool = OpenMPPool(binding.OMP, 2)
    outs = [np.zeros(4096, np.int64) for _ in range(4)]
    errors = []

    def caller(k):
        try:
            for i in range(100):
                if not pool.run(_fill, (outs[k], i * 10 + k), [(0, 2048), (2048, 4096)]):
                    _fill(outs[k], i * 10 + k, 0, 4096)
                assert (outs[k] == i * 10 + k).all()
        except Exception as e:
            errors.append(e)

    _in_threads(caller, 4)
    assert not errors


def test_concurrent_callers_share_the_pool_without_mixing_chunks(restore_threads):
    import numpy as np

    _threads.set_threads(2)
    outs = [np.zeros(4096, np.int64) for _ in range(4)]
    errors = []

    def caller(k):
        try:
            for i in range(100):
                _threads.parallel_for(_fill, outs[k].size, 1 << 20, outs[k], i * 10 + k)
                assert (outs[k] == i * 10 + k).all()
        except Exception as e:
            errors.append(e)

    _in_threads(caller, 4)
    assert not errors


def _run_own_process(script: str, **settings: str) -> str:
    """`script` in a Python process of its own (libgomp reads its wait policy once, when it loads), with the engine
    `settings` and none of OpenMP's own; its stdout."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "NNSERVE_SPIN_US", "NNSERVE_OPENMP")}
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]  # where this process found packages
    env["PYTHONPATH"] = os.pathsep.join([str(here), str(here.parents[2]), *inherited])
    env.update(settings)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=240,
                          cwd=here.parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


IDLE_SCRIPT = """
import os, sys, time
import numpy as np
import engine
from engine.devices.cpu import threads
from fixture_models import assert_close_to_torch, cases, max_shapes, model_path
model = engine.load(model_path("resnet"))
inst = model.instance(max_shapes=max_shapes("resnet"))
feeds, want = cases("resnet")[0]
threads.MIN_WORK = 0  # every kernel that can split does: the pool of the policy runs them
for _ in range(5):
    assert_close_to_torch(inst.run(feeds), want)
print(type(threads._get_pool()).__name__)
time.sleep(0.5)  # the spin bound is milliseconds: every thread is asleep by now
t0, c0 = time.monotonic(), time.process_time()
time.sleep(2.0)
print(os.environ.get("KMP_BLOCKTIME"), os.environ.get("GOMP_SPINCOUNT"), os.environ.get("OMP_WAIT_POLICY"),
      time.process_time() - c0)
"""


@pytest.mark.parametrize("policy, pool", [("short", "SpinPool"), ("run", "OpenMPPool")])
def test_a_loaded_idle_instance_burns_no_cpu(tmp_path, policy, pool):
    """After its requests an instance's threads (the pool's and oneDNN's OpenMP team) all sleep: the process uses
    (almost) no CPU while idle. Its own process, so that libgomp reads the wait policy the engine sets. Under the
    `run` policy our kernels run on OpenMP's team, outputs unchanged."""
    out = _run_own_process(IDLE_SCRIPT, NNSERVE_WAIT_POLICY=policy).split()
    used, blocktime, spincount, omp_policy, idle_cpu = out[-5:]
    assert used == pool
    assert omp_policy == "None" and int(spincount) > 0  # bounded spin, not PASSIVE, not ACTIVE
    assert blocktime == ("20000us" if policy == "run" else "2us")  # Intel's OpenMP: through a request, or 2 us
    assert float(idle_cpu) < 0.05, f"{idle_cpu} s of CPU in 2 s of idling"


RELEASE_SCRIPT = """
import ctypes, os, sys, threading, time
import numpy as np
import engine
from engine.devices.cpu import threads
from engine.devices.cpu.onednn import binding
from engine.devices.cpu.openmp_pool import OpenMPPool
from fixture_models import assert_close_to_torch, cases, max_shapes, model_path
api = ctypes.pythonapi
api.PyInterpreterState_Main.restype = ctypes.c_void_p
api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
api.PyThreadState_Next.restype = ctypes.c_void_p
api.PyThreadState_Next.argtypes = [ctypes.c_void_p]

def thread_states():
    n, t = 0, api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Main())
    while t:
        n, t = n + 1, api.PyThreadState_Next(t)
    return n

def os_threads():
    return len(os.listdir("/proc/self/task"))

def settle(count, want, deadline=60.0):  # exiting threads give their state back on their way out: waited for
    end = time.monotonic() + deadline
    while count() > want and time.monotonic() < end:
        time.sleep(0.01)
    return count()

def fill(out, value, lo, hi):
    out[lo:hi] = value

inst = engine.load(model_path("resnet")).instance(max_shapes=max_shapes("resnet"))
feeds, want = cases("resnet")[0]
assert type(threads._get_pool()).__name__ == "OpenMPPool" and threads.get_threads() == 3
base_states, base_threads = thread_states(), os_threads()
report = []

def split(pool):
    out = np.zeros(1 << 16)
    assert pool.run(fill, (out, 7.0), [(0, 1 << 15), (1 << 15, 1 << 16)])  # Python callbacks on OpenMP threads
    assert (out == 7.0).all()

def job():
    pool = threads._get_pool()
    assert_close_to_torch(inst.run(feeds), want)
    split(pool)  # 2 chunks on the whole team, 3 threads: our regions never shrink it
    full = (thread_states(), os_threads())
    inside = []
    assert pool.run(lambda lo, hi: inside.append(engine.release_thread()), (), [(0, 1), (1, 2), (2, 3)])
    released = engine.release_thread()  # the team goes
    # libgomp ends the team's two threads (waited for); Intel's runtime keeps its pool, so waiting there would only
    # run out the deadline (60 s a job, 3 jobs: the script then brushed its 240 s limit on a loaded machine)
    gone = settle(os_threads, full[1] - 2, 60.0 if os.environ['NNSERVE_OPENMP'] == 'gnu' else 0.5)
    assert_close_to_torch(inst.run(feeds), want)  # a new team, same outputs
    report.append((full[0] - base_states, full[1] - base_threads, inside, released, gone - full[1]))

def exited(tid, deadline=60.0):  # join returns before the OS thread has run its exit, where OpenMP lets its team go
    end = time.monotonic() + deadline
    while os.path.exists(f"/proc/self/task/{tid}") and time.monotonic() < end:
        time.sleep(0.01)

for _ in range(3):  # each a new master thread, which ends with a team (its exit ends that team too)
    t = threading.Thread(target=job)
    t.start()
    t.join()
    exited(t.native_id)  # else the next master may form its team before this one's went back to Intel's pool
print(repr(report), settle(thread_states, base_states) - base_states, settle(os_threads, base_threads) - base_threads)
"""


@pytest.mark.parametrize("runtime", ["gnu", "intel"])
def test_a_released_team_goes_and_openmp_threads_keep_no_python_state(tmp_path, runtime):
    """engine.release_thread: the calling thread's OpenMP team is let go, and a run after it gives the same
    outputs; inside a parallel region it refuses (False: try later). OpenMP threads that ran our Python callbacks
    hold no Python thread state between regions, so none is left behind when the runtime ends them. libgomp ends the
    team's threads (a new master makes a team of its own); Intel's OpenMP keeps one pool of threads for every
    master, which a release puts to sleep. Its own process: three threads, the `run` policy (our kernels on
    OpenMP's team). Each master's OS thread is waited out before the next starts: Thread.join returns before the
    thread's exit has run, where Intel's runtime hands its team back to the pool, and a master that forms its team
    meanwhile gets two new threads, which stay pooled (under a loaded machine's load, 3 of 17 runs without the
    wait, 0 of 17 with it)."""
    if runtime == "intel" and not Path(sys.prefix, "lib", "libiomp5.so").exists():
        pytest.skip("Intel's OpenMP (the intel-openmp wheel, an x86-64 Linux dependency) is not installed here")
    out = _run_own_process(RELEASE_SCRIPT, NNSERVE_WAIT_POLICY="run", NNSERVE_NUM_THREADS="3",
                           NNSERVE_OPENMP=runtime)
    report, states_left, threads_left = out.strip().rsplit(" ", 2)
    for states, threads_up, inside, released, gone in eval(report):
        assert states == 1  # the master's own state only; its 2 OpenMP threads hold none
        assert inside == [False] * 3  # every thread of a region, the master included, is refused
        assert released
        if runtime == "gnu":
            assert threads_up == 3 and gone == -2  # a team of its own, and the whole team went
        else:
            assert threads_up in (1, 3) and gone <= 0  # the master, its workers from the pool (new or not)
    assert int(states_left) == 0 and int(threads_left) == 0
