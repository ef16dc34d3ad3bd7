"""instance_group KIND_GPU / KIND_AUTO: instances on cuda:N, a clear load error where the device is missing, and
the device-labelled memory metrics. The GPU path runs for real under numba's CUDA simulator
(NUMBA_ENABLE_CUDASIM=1 in the server's environment), which executes the same kernels without a GPU."""

from __future__ import annotations

import os

import httpx
import numpy as np
import pytest
from serverproc import AFFINE_CONFIG, ServerProcess, affine_reference, make_repository, sample

from server.metrics import ServerMetrics

X = np.arange(12, dtype=np.float32).reshape(3, 4) / 7 - 0.5
GPU_CONFIG = AFFINE_CONFIG.replace("count: 2 kind: KIND_CPU", "count: 1 kind: KIND_GPU")
AUTO_CONFIG = AFFINE_CONFIG.replace(" kind: KIND_CPU", "")
NO_GPU = {"NUMBA_ENABLE_CUDASIM": "0", "CUDA_VISIBLE_DEVICES": ""}  # a machine with a GPU must not find it here
SIMULATED_GPU = {"NUMBA_ENABLE_CUDASIM": "1"}


class FakeCudaInstance:
    """What the metrics read of a server.backend.BackendInstance on a GPU."""

    device_name = "cuda:1"
    memory_bytes = 4096
    device_memory_bytes = 6144

    def device_memory(self) -> tuple[int, int]:
        return 10_000, 80_000


def infer(srv: ServerProcess, model: str) -> httpx.Response:
    body = {"inputs": [{"name": "in0", "shape": list(X.shape), "datatype": "FP32", "data": X.ravel().tolist()}]}
    return httpx.post(f"http://{srv.http_url}/v2/models/{model}/infer", json=body, timeout=60)


def assert_affine(r: httpx.Response) -> None:
    assert r.status_code == 200, r.text
    ref = affine_reference(X)
    for out in r.json()["outputs"]:
        np.testing.assert_allclose(np.array(out["data"]).reshape(out["shape"]), ref[out["name"]], rtol=1e-5,
                                   atol=1e-6)


def test_metrics_label_instances_with_their_device():
    m = ServerMetrics()
    m.instances_placed("m", "1", [FakeCudaInstance()])
    m.model_loaded("m", "1", 0.5, [4096])
    text = m.render().decode()
    assert sample(text, "nnserve_arena_bytes", model="m", instance="0", device="cuda:1") == 4096
    assert sample(text, "nnserve_instance_device_memory_bytes", model="m", device="cuda:1") == 6144
    assert sample(text, "nnserve_device_memory_used_bytes", device="cuda:1") == 10_000
    assert sample(text, "nnserve_device_memory_total_bytes", device="cuda:1") == 80_000
    # a reload loads the new copy before the old one is retired: retiring the old must keep the new series
    m.instances_placed("m", "1", [FakeCudaInstance()])
    m.model_loaded("m", "1", 0.4, [4096])
    m.model_unloaded("m", "1", instances=1)
    assert sample(m.render().decode(), "nnserve_arena_bytes", model="m", device="cuda:1") == 4096
    m.model_unloaded("m", "1", instances=1)
    text = m.render().decode()
    assert "nnserve_arena_bytes{" not in text and "nnserve_device_memory_total_bytes{" not in text


@pytest.mark.slow
def test_kind_gpu_without_a_device_is_a_load_error_and_kind_auto_runs_on_cpu(tmp_path):
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG, "gpu": GPU_CONFIG, "auto": AUTO_CONFIG})
    srv = ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", "affine", env=NO_GPU)
    try:
        r = httpx.post(f"http://{srv.http_url}/v2/repository/models/gpu/load", timeout=60)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert "model 'gpu'" in error and "cuda:0" in error and "no CUDA device" in error, error
        assert not httpx.get(f"http://{srv.http_url}/v2/models/gpu/ready").status_code == 200

        assert httpx.post(f"http://{srv.http_url}/v2/repository/models/auto/load", timeout=60).status_code == 200
        group = httpx.get(f"http://{srv.http_url}/v2/models/auto/config").json()["instance_group"]
        assert [(g["kind"], g["count"]) for g in group] == [("KIND_CPU", 2)]
        assert_affine(infer(srv, "auto"))
        text = httpx.get(srv.metrics_url).text
        assert sample(text, "nnserve_arena_bytes", model="auto", instance="1", device="cpu") > 0
    finally:
        assert srv.stop() == 0, srv.log_text


@pytest.mark.slow
def test_kind_gpu_places_instances_on_cuda0_under_the_simulator(tmp_path):
    repo = make_repository(tmp_path / "repo", {"gpu": GPU_CONFIG, "auto": AUTO_CONFIG})
    srv = ServerProcess(repo, env=SIMULATED_GPU)
    try:
        config = httpx.get(f"http://{srv.http_url}/v2/models/gpu/config").json()
        # every field printed, at its default too, as Triton does (issue 21 item 9)
        assert [{k: g[k] for k in ("count", "kind", "gpus")} for g in config["instance_group"]] == [
            {"count": 1, "kind": "KIND_GPU", "gpus": [0]}]
        assert config["instance_group"][0]["passive"] is False
        auto = httpx.get(f"http://{srv.http_url}/v2/models/auto/config").json()["instance_group"]
        assert [(g["kind"], g["gpus"]) for g in auto] == [("KIND_GPU", [0])]  # KIND_AUTO finds the device
        for model in ("gpu", "auto"):
            assert_affine(infer(srv, model))
        text = httpx.get(srv.metrics_url).text
        arena = sample(text, "nnserve_arena_bytes", model="gpu", instance="0", device="cuda:0")
        assert arena > 0
        # the instance's device memory: its arena and workspace plus the weights it uploaded (3x4 + 3 floats)
        assert sample(text, "nnserve_instance_device_memory_bytes", model="gpu", device="cuda:0") >= arena + 60
        assert sample(text, "nnserve_arena_bytes", model="auto", instance="1", device="cuda:0") == arena
        with pytest.raises(AssertionError):  # no CPU instance anywhere
            sample(text, "nnserve_arena_bytes", device="cpu")
    finally:
        assert srv.stop() == 0, srv.log_text


def _real_gpu_or_skip() -> None:
    """numba's own answer in this process (the simulator is never enabled in the main test process)."""
    try:
        from numba import cuda
    except ImportError as e:
        pytest.skip(f"no CUDA device: numba.cuda is not importable ({e})")
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or not cuda.is_available():
        pytest.skip("no CUDA device: numba.cuda.is_available() is False on this machine")


@pytest.mark.gpu
@pytest.mark.slow
def test_kind_gpu_serves_from_a_real_device(tmp_path):
    """The same server path as under the simulator, on the GPU itself: placement, numbers, and the device's own
    memory figures in the metrics."""
    _real_gpu_or_skip()
    repo = make_repository(tmp_path / "repo", {"gpu": GPU_CONFIG, "auto": AUTO_CONFIG})
    srv = ServerProcess(repo, env={"NUMBA_ENABLE_CUDASIM": "0"})
    try:
        auto = httpx.get(f"http://{srv.http_url}/v2/models/auto/config").json()["instance_group"]
        assert [(g["kind"], g["gpus"]) for g in auto] == [("KIND_GPU", [0])]
        for model in ("gpu", "auto"):
            for _ in range(3):  # the first call compiles; later ones reuse the arena
                assert_affine(infer(srv, model))
        text = httpx.get(srv.metrics_url).text
        total = sample(text, "nnserve_device_memory_total_bytes", device="cuda:0")
        used = sample(text, "nnserve_device_memory_used_bytes", device="cuda:0")
        assert total > 1 << 30 and 0 < used <= total  # a real card's memory, not the simulator's figure
        assert sample(text, "nnserve_arena_bytes", model="gpu", instance="0", device="cuda:0") > 0
    finally:
        assert srv.stop() == 0, srv.log_text
