"""config `reshape`: requests use the API shape in `dims`, the model gets its own shape (reshape.shape), outputs
come back in their `dims`; with and without batching, fixed and variable dims, warm-up included."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from serverproc import ServerProcess, affine_reference, make_repository

pytestmark = pytest.mark.slow  # starts its own server

BATCHED = """
name: "affine"
max_batch_size: 8
input [ { name: "in0" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape { shape: [ 4 ] } } ]
output [ { name: "out0" data_type: TYPE_FP32 dims: [ 3, 1 ] reshape { shape: [ 3 ] } },
         { name: "out1" data_type: TYPE_FP32 dims: [ 3 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
model_warmup [ { name: "w" batch_size: 2 inputs { key: "in0" value { data_type: TYPE_FP32 dims: [ 2, 2 ]
                 random_data: true } } } ]
"""
UNBATCHED = """
name: "affine"
max_batch_size: 0
input [ { name: "in0" data_type: TYPE_FP32 dims: [ -1, 2, 2 ] reshape { shape: [ -1, 4 ] } } ]
output [ { name: "out0" data_type: TYPE_FP32 dims: [ -1, 3, 1 ] reshape { shape: [ -1, 3 ] } },
         { name: "out1" data_type: TYPE_FP32 dims: [ -1, 3 ] } ]
parameters { key: "max_shape:in0" value { string_value: "8,2,2" } }
"""
X = (np.arange(12, dtype=np.float32).reshape(3, 2, 2) - 5) / 4


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    repo = make_repository(tmp_path_factory.mktemp("reshape"), {"batched": BATCHED, "unbatched": UNBATCHED})
    server = ServerProcess(repo)
    yield server
    assert server.stop() == 0, server.log_text


def infer(srv: ServerProcess, model: str, x: np.ndarray) -> httpx.Response:
    body = {"inputs": [{"name": "in0", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    return httpx.post(f"http://{srv.http_url}/v2/models/{model}/infer", json=body, timeout=30)


@pytest.mark.parametrize("model", ["batched", "unbatched"])
def test_reshape_round_trip(srv, model):
    meta = httpx.get(f"http://{srv.http_url}/v2/models/{model}").json()
    assert meta["inputs"][0]["shape"] == [-1, 2, 2]
    assert {o["name"]: o["shape"] for o in meta["outputs"]} == {"out0": [-1, 3, 1], "out1": [-1, 3]}
    r = infer(srv, model, X)
    assert r.status_code == 200, r.text
    ref = affine_reference(X.reshape(3, 4))  # the model sees [3, 4]
    outputs = {o["name"]: o for o in r.json()["outputs"]}
    assert outputs["out0"]["shape"] == [3, 3, 1] and outputs["out1"]["shape"] == [3, 3]
    np.testing.assert_allclose(np.array(outputs["out0"]["data"]).reshape(3, 3, 1), ref["out0"][..., None],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(outputs["out1"]["data"]).reshape(3, 3), ref["out1"], rtol=1e-5, atol=1e-6)


def test_model_shape_is_not_the_api_shape(srv):
    r = infer(srv, "batched", X.reshape(3, 4))
    assert r.status_code == 400 and "unexpected shape for input 'in0'" in r.json()["error"], r.text
    r = infer(srv, "unbatched", np.zeros((9, 2, 2), np.float32))  # over the max shape 8,2,2
    assert r.status_code == 400 and "exceeds the max shape" in r.json()["error"], r.text
