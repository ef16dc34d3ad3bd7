"""The version policy decides which version directories are read at all: a broken version the policy does not
select must not stop the model from loading."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from serverproc import AFFINE_CONFIG, FIXTURES, ServerProcess, affine_reference, make_repository

from server.errors import ModelLoadError
from server.repository import ModelRepository

LATEST_1 = AFFINE_CONFIG + "version_policy { latest { num_versions: 1 } }\n"
SPECIFIC_1 = AFFINE_CONFIG + "version_policy { specific { versions: [ 1 ] } }\n"


def repo_with_broken_v1(tmp_path, config: str):
    repo = make_repository(tmp_path / "repo", {"affine": config})
    (repo / "affine" / "2").mkdir()
    for f in (FIXTURES / "affine" / "1").iterdir():
        (repo / "affine" / "2" / f.name).write_bytes(f.read_bytes())
    (repo / "affine" / "1" / "model.pnnx.param").write_text("7767517\nthis is not a pnnx graph\n")
    return repo


def test_only_selected_versions_are_read(tmp_path):
    read = []

    def load(path):
        import engine

        read.append(path.parent.name)
        return engine.load(path)

    async def load_and_stop(repo: ModelRepository) -> list[str]:
        await repo.load("affine")
        versions = list(repo.entry("affine").versions)
        await repo.shutdown()
        return versions

    versions = asyncio.run(load_and_stop(ModelRepository(repo_with_broken_v1(tmp_path, LATEST_1), load_fn=load)))
    assert read == ["2"] and versions == ["2"]


def test_a_selected_broken_version_is_still_a_load_error(tmp_path):
    repo = ModelRepository(repo_with_broken_v1(tmp_path, SPECIFIC_1))
    with pytest.raises(ModelLoadError, match="model 'affine' version 1"):
        asyncio.run(repo.load("affine"))


@pytest.mark.slow
def test_broken_old_version_does_not_stop_the_latest(tmp_path):
    srv = ServerProcess(repo_with_broken_v1(tmp_path, LATEST_1))
    try:
        index = httpx.post(f"http://{srv.http_url}/v2/repository/index", json={}).json()
        assert index == [{"name": "affine", "version": "2", "state": "READY", "reason": ""}]
        x = np.ones((2, 4), np.float32)
        body = {"inputs": [{"name": "in0", "shape": [2, 4], "datatype": "FP32", "data": x.ravel().tolist()}]}
        r = httpx.post(f"http://{srv.http_url}/v2/models/affine/infer", json=body, timeout=30)
        assert r.status_code == 200 and r.json()["model_version"] == "2", r.text
        out0 = r.json()["outputs"][0]
        np.testing.assert_allclose(np.array(out0["data"]).reshape(2, 3), affine_reference(x)[out0["name"]],
                                   rtol=1e-5, atol=1e-6)
    finally:
        assert srv.stop() == 0, srv.log_text


def test_the_loader_thread_lets_its_kernel_threads_go_after_the_warm_up(tmp_path, monkeypatch):
    """A load's warm-up runs on a loader thread, whose OpenMP team would otherwise stay and cut the serving
    threads' spin (server/scheduling/workers.py): the loader lets it go when the load is done, failed or not."""
    import threading

    import engine

    warmed, released = [], []
    real_run = engine.Instance.run_timed

    def run_timed(self, *args, **kwargs):
        warmed.append(threading.current_thread().name)
        return real_run(self, *args, **kwargs)

    monkeypatch.setattr(engine.Instance, "run_timed", run_timed)
    monkeypatch.setattr(engine, "release_thread", lambda: released.append(threading.current_thread().name) or True)
    warmup = ('model_warmup [ { name: "w" batch_size: 1 count: 2 inputs { key: "in0" value { data_type: TYPE_FP32 '
              'dims: [ 4 ] zero_data: true } } } ]\n')
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG + warmup, "broken": AFFINE_CONFIG})
    (repo / "broken" / "1" / "model.pnnx.param").write_text("7767517\nthis is not a pnnx graph\n")

    async def load_both(repository: ModelRepository) -> None:
        await repository.load("affine")
        with pytest.raises(ModelLoadError):
            await repository.load("broken")
        await repository.shutdown()

    asyncio.run(load_both(ModelRepository(repo)))
    assert len(warmed) == 4 and len(set(warmed)) == 1  # two instances, two runs each, on a loader thread
    assert warmed[0] != threading.current_thread().name
    loaders = [name for name in released if not name.startswith("nnserve-infer")]  # the workers let go at shutdown
    assert loaders[0] == warmed[0] and len(loaders) == 2  # after the warm-up, on its thread; and after the failure
