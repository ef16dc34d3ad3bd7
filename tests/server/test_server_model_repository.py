"""The shipped model_repository/ served end to end: both UltraFace models against TNN's own reference outputs.

The reference (tests/fixtures/ultraface/reference.npz, written by make_reference.py there) is committed, so this
runs everywhere; only the check that it still equals the outputs in ../shared needs that folder.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serverproc import ServerProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE = REPO_ROOT / "tests" / "fixtures" / "ultraface"
SHARED = REPO_ROOT.parent / "shared" / "models" / "tnn" / "ultraface_slim320"

def _fixture_module():  # noqa: ANN202 - the fixture's own input recipe, loaded by path (tests/ is no package)
    spec = importlib.util.spec_from_file_location("ultraface_make_reference", FIXTURE / "make_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_reference = _fixture_module()

pytestmark = pytest.mark.slow  # two UltraFace models, two instances each, warmed up before ready

MODELS = {"ultraface_tnn": ("input", "scores", "boxes"), "ultraface_pnnx": ("in0", "out0", "out1")}


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    ref = np.load(FIXTURE / "reference.npz")
    x = make_reference.make_input()
    assert make_reference.digest(x) == str(ref["input_sha256"]), "numpy's generator no longer gives the input"
    return {"input": x, "scores": ref["scores"], "boxes": ref["boxes"]}


@pytest.fixture(scope="module")
def shipped():
    srv = ServerProcess(REPO_ROOT / "model_repository")
    yield srv
    assert srv.stop() == 0, srv.log_text


@pytest.mark.parametrize("model", sorted(MODELS))
def test_ultraface_matches_tnn_reference(shipped, reference, model):
    x = reference["input"]
    name_in, name_scores, name_boxes = MODELS[model]
    client = grpcclient.InferenceServerClient(shipped.grpc_url)
    inp = grpcclient.InferInput(name_in, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp])
    for name, key in ((name_scores, "scores"), (name_boxes, "boxes")):
        ref = reference[key]
        np.testing.assert_allclose(result.as_numpy(name).reshape(ref.shape), ref, atol=1e-4)


@pytest.mark.shared
@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared (TNN's reference outputs) is not present")
def test_committed_reference_is_tnn_output(reference):
    """The committed fixture is exactly TNN's run in ../shared, on the same input."""
    np.testing.assert_array_equal(reference["input"], np.load(SHARED / "input.npy"))
    np.testing.assert_array_equal(reference["scores"], np.load(SHARED / "output_tnn__scores.npy"))
    np.testing.assert_array_equal(reference["boxes"], np.load(SHARED / "output_tnn__boxes.npy"))


def test_shipped_configs_load_as_written(shipped):
    client = httpclient.InferenceServerClient(shipped.http_url)
    for model in MODELS:
        config = client.get_model_config(model)
        assert config["max_batch_size"] == 1 and config["instance_group"][0]["count"] == 2
        assert config["instance_group"][0]["kind"] == "KIND_CPU"
        assert client.get_model_metadata(model)["inputs"][0]["shape"] == [-1, 3, 240, 320]
    assert "arena" in shipped.log_text and "loaded model 'ultraface_tnn'" in shipped.log_text


def test_the_bundled_models_serve_without_their_configs(tmp_path, reference):
    """Auto-complete alone (no config.pbtxt) loads both detectors, whose files fix dim 0 to 1: max_batch_size 0, as
    Triton gives, and the same outputs as TNN."""
    repo = tmp_path / "repo"
    shutil.copytree(REPO_ROOT / "model_repository", repo)
    for model in MODELS:
        (repo / model / "config.pbtxt").unlink()
    srv = ServerProcess(repo)
    try:
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        for model, (name_in, name_scores, name_boxes) in MODELS.items():
            assert client.get_model_config(model, as_json=True)["config"].get("max_batch_size", 0) == 0
            inp = grpcclient.InferInput(name_in, [1, 3, 240, 320], "FP32")
            inp.set_data_from_numpy(reference["input"])
            result = client.infer(model, [inp])
            for name, key in ((name_scores, "scores"), (name_boxes, "boxes")):
                ref = reference[key]
                np.testing.assert_allclose(result.as_numpy(name).reshape(ref.shape), ref, atol=1e-4)
    finally:
        assert srv.stop() == 0, srv.log_text
