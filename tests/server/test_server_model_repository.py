"""The shipped model_repository/ served end to end: both UltraFace models against TNN's own reference outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serverproc import ServerProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED = REPO_ROOT.parent / "shared" / "models" / "tnn" / "ultraface_slim320"

pytestmark = [pytest.mark.slow, pytest.mark.shared,
              pytest.mark.skipif(not SHARED.is_dir(), reason="../shared (TNN reference outputs) is not present")]

MODELS = {"ultraface_tnn": ("input", "scores", "boxes"), "ultraface_pnnx": ("in0", "out0", "out1")}


@pytest.fixture(scope="module")
def shipped():
    srv = ServerProcess(REPO_ROOT / "model_repository")
    yield srv
    assert srv.stop() == 0, srv.log_text


@pytest.mark.parametrize("model", sorted(MODELS))
def test_ultraface_matches_tnn_reference(shipped, model):
    x = np.load(SHARED / "input.npy")
    ref_scores = np.load(SHARED / "output_tnn__scores.npy")
    ref_boxes = np.load(SHARED / "output_tnn__boxes.npy")
    name_in, name_scores, name_boxes = MODELS[model]
    client = grpcclient.InferenceServerClient(shipped.grpc_url)
    inp = grpcclient.InferInput(name_in, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp])
    np.testing.assert_allclose(result.as_numpy(name_scores).reshape(ref_scores.shape), ref_scores, atol=1e-4)
    np.testing.assert_allclose(result.as_numpy(name_boxes).reshape(ref_boxes.shape), ref_boxes, atol=1e-4)


def test_shipped_configs_load_as_written(shipped):
    client = httpclient.InferenceServerClient(shipped.http_url)
    for model in MODELS:
        config = client.get_model_config(model)
        assert config["max_batch_size"] == 1 and config["instance_group"][0]["count"] == 2
        assert client.get_model_metadata(model)["inputs"][0]["shape"] == [-1, 3, 240, 320]
    assert "arena" in shipped.log_text and "loaded model 'ultraface_tnn'" in shipped.log_text
