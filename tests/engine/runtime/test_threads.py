"""Thread count: NNSERVE_NUM_THREADS, the cgroup CPU quota, BLAS kept to one thread (threadpoolctl), an instance's
own `threads=` applied while it runs (outputs still match PyTorch's)."""

from __future__ import annotations

import pytest
from fixture_models import assert_close_to_torch, cases, max_shapes, model_path
from threadpoolctl import threadpool_info

import engine
from engine.devices.cpu import threads as _threads
from engine.devices.cpu.options import CpuOptions


@pytest.fixture
def restore_threads():
    before = _threads.get_threads()
    yield
    _threads.set_threads(before)


def _blas_threads() -> set[int]:
    return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


@pytest.mark.parametrize("text, want", [("max 100000\n", None), ("150000 100000\n", 2), ("50000 100000", 1),
                                        ("400000 100000", 4), ("garbage", None)])
def test_cgroup_quota_parsed(tmp_path, text, want):
    f = tmp_path / "cpu.max"
    f.write_text(text)
    assert _threads.cgroup_cpus(f) == want


def test_missing_cgroup_file_means_unlimited(tmp_path):
    assert _threads.cgroup_cpus(tmp_path / "absent") is None


def test_env_setting_wins(monkeypatch):
    setting = CpuOptions.from_env({"NNSERVE_NUM_THREADS": "3"}).threads
    assert setting == 3 and _threads.default_threads(setting) == 3
    setting = CpuOptions.from_env({"NNSERVE_NUM_THREADS": "zero"}).threads
    monkeypatch.setattr(_threads, "cgroup_cpus", lambda path=None: 1)
    assert setting is None and _threads.default_threads(setting) == 1  # a bad setting: the quota-capped CPU count


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
