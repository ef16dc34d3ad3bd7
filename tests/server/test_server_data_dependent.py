"""A model whose output size depends on the input's values (TNN's NonZero) serves: each response carries the
output at its actual shape, auto-complete gives -1 for that dim and max_batch_size 0, and a config that asks to
batch such a model is refused at load (a batch's NonZero rows cannot be split per request)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from serverproc import ServerProcess

from engine.ir import Graph
from engine.passes.pipeline import run_pipeline
from engine.runtime.model import Model
from server import config as cfg
from server.errors import ModelLoadError
from server.model_config import model_config_pb2 as mc
from tests.engine.formats.tnn.test_tnn_lowering import tnn_model


def nonzero_repository(root: Path) -> Path:
    """<root>/nonzero/1/model.tnnproto: x (3, 4) float -> NonZero -> t (2, n) int32 -> Permute -> y (n, 2)."""
    built = root / "built"
    built.mkdir(parents=True)
    tnn_model(built, "x 2 3 4 0", ["NonZero n 1 1 x t", "Permute p 1 1 t y 2 1 0"], "t y")
    version = root / "repo" / "nonzero" / "1"
    version.mkdir(parents=True)
    shutil.copy(built / "m.tnnproto", version / "model.tnnproto")
    shutil.copy(built / "m.tnnmodel", version / "model.tnnmodel")
    return root / "repo"


@pytest.mark.slow
def test_nonzero_model_serves_outputs_at_their_actual_shapes(tmp_path):
    server = ServerProcess(nonzero_repository(tmp_path))
    try:
        config = httpx.get(f"http://{server.http_url}/v2/models/nonzero/config", timeout=30).json()
        assert int(config.get("max_batch_size", 0)) == 0
        assert {o["name"]: [int(d) for d in o["dims"]] for o in config["output"]} == {"t": [2, -1], "y": [-1, 2]}
        client = httpclient.InferenceServerClient(server.http_url)
        shapes = []
        for x in (np.array([[0, 1, 0, 0], [2, 0, 0, 0], [0, 0, 3, 4]], np.float32), np.zeros((3, 4), np.float32)):
            inp = httpclient.InferInput("x", [3, 4], "FP32")
            inp.set_data_from_numpy(x)
            result = client.infer("nonzero", [inp])
            want = np.stack(np.nonzero(x))
            np.testing.assert_array_equal(result.as_numpy("t"), want)
            np.testing.assert_array_equal(result.as_numpy("y"), want.T)
            shapes.append(result.get_output("t")["shape"])
        assert shapes == [[2, 4], [2, 0]]
        client.close()
    finally:
        assert server.stop() == 0, server.log_text


def nms_model() -> Model:
    """boxes (-1, 6, 4), scores (-1, 1, 6) -> NonMaxSuppression -> kept (-1, 3): dim 0 varies, yet is no batch."""
    g = Graph()
    boxes, scores = g.value("boxes", (-1, 6, 4), np.float32), g.value("scores", (-1, 1, 6), np.float32)
    g.inputs = [boxes, scores]
    kept = g.add_node("NonMaxSuppression", [boxes, scores], name="nms",
                      params={"max_output_boxes_per_class": 2, "iou_threshold": 0.5}).outputs[0]
    kept.name = "kept"
    g.outputs = [kept]
    return Model(run_pipeline(g), "nms")


def test_batching_a_data_dependent_output_is_refused():
    model = nms_model()
    assert model.outputs[0].shape == (-1, 3) and model.data_dependent_outputs == ["kept"]
    config = cfg.auto_complete(mc.ModelConfig(), "nms", "canonical", model, has_max_batch=False,
                               default_max_batch_size=4)
    assert config.max_batch_size == 0  # auto-complete does not batch it, though every dim 0 is -1
    asked = mc.ModelConfig(name="nms", max_batch_size=4)
    cfg.auto_complete(asked, "nms", "canonical", model, has_max_batch=True, default_max_batch_size=4)
    with pytest.raises(ModelLoadError, match="max_batch_size 4 .* 'kept' depends on the input's values"):
        cfg.validate(asked, "nms", model)


DD_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pnnx_dd"


def detections_repository(root: Path) -> Path:
    """<root>/repo/{detections,kept_sum}/1: pnnx exports (tools/make_dd_goldens.py) of
    torch.cat([boxes[keep], scores[keep].unsqueeze(1)], 1) and of boxes[keep].sum(0), keep = scores > 0.5."""
    for name, case in (("detections", "cat_columns"), ("kept_sum", "sum_rows")):
        version = root / "repo" / name / "1"
        version.mkdir(parents=True)
        for suffix in (".pnnx.param", ".pnnx.bin"):
            shutil.copy(DD_FIXTURES / case / f"model{suffix}", version / f"model{suffix}")
    return root / "repo"


@pytest.mark.slow
def test_ops_after_a_mask_serve_nothing_kept_and_everything_kept(tmp_path):
    """Concat of the kept rows along the other axis, and a sum over them: auto-complete gives -1 for the kept
    dim (the sum's shape is fixed), and each response has the actual shape, 0 rows and all rows included."""
    server = ServerProcess(detections_repository(tmp_path))
    try:
        dims = {}
        for name in ("detections", "kept_sum"):
            config = httpx.get(f"http://{server.http_url}/v2/models/{name}/config", timeout=30).json()
            assert int(config.get("max_batch_size", 0)) == 0
            dims[name] = [[int(d) for d in o["dims"]] for o in config["output"]]
        assert dims == {"detections": [[-1, 5]], "kept_sum": [[4]]}
        client = httpclient.InferenceServerClient(server.http_url)
        for run, rows in (("none", 0), ("all", 6), ("some", 3)):
            for name, case in (("detections", "cat_columns"), ("kept_sum", "sum_rows")):
                io = np.load(DD_FIXTURES / case / f"io_{run}.npz")
                feeds = []
                for key, datatype in (("in0", "FP32"), ("in1", "FP32")):
                    inp = httpclient.InferInput(key, list(io[key].shape), datatype)
                    inp.set_data_from_numpy(io[key])
                    feeds.append(inp)
                result = client.infer(name, feeds)
                got = result.as_numpy("out0")
                assert result.get_output("out0")["shape"] == list(io["out0"].shape)
                if name == "detections":
                    assert got.shape == (rows, 5)
                    np.testing.assert_array_equal(got, io["out0"])
                else:  # float32 sums in another order than torch's: equal to an ulp
                    np.testing.assert_allclose(got, io["out0"], rtol=1e-6, atol=0)
        client.close()
    finally:
        assert server.stop() == 0, server.log_text
