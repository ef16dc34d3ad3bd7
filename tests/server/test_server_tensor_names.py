"""A PNNX model's tensors under a Triton config's names: pnnx names them in0, in1, out0, ...; a config that names
none of them as the model does takes them in order (INPUT0 is in0), checked for counts, datatypes and dims, and
everything the server shows uses the config's names. On the real server with Triton's `simple` model (add/sub)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serverproc import FIXTURES, ServerProcess

from server.errors import ModelLoadError
from server.tensor_names import check_not_mixed, positional

SIMPLE = (FIXTURES / "simple" / "config.pbtxt").read_text()
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, np.int32)


def repository(root: Path, configs: dict[str, str]) -> Path:
    for name, config in configs.items():
        shutil.copytree(FIXTURES / "simple", root / name)
        (root / name / "config.pbtxt").write_text(config.replace('name: "simple"', f'name: "{name}"'))
    return root


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    bad = {
        "fewer": SIMPLE.replace('  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }\n', "").replace(
            'dims: [ 16 ] },\n]', "dims: [ 16 ] }\n]"),
        "mixed": SIMPLE.replace('"INPUT0"', '"in0"'),
        "mixed_kinds": SIMPLE.replace('"OUTPUT0"', '"out0"'),  # a typo'd input is no mapping either
        "typed": SIMPLE.replace('{ name: "OUTPUT1" data_type: TYPE_INT32', '{ name: "OUTPUT1" data_type: TYPE_FP32'),
        "shaped": SIMPLE.replace('{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }',
                                 '{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 8 ] }'),
    }
    repo = repository(tmp_path_factory.mktemp("namesrepo"), {"simple": SIMPLE, **bad})
    server = ServerProcess(repo, "--exit-on-error", "false", "--strict-readiness", "false")
    yield server
    assert server.stop() == 0, server.log_text


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_triton_names_on_a_pnnx_model(srv, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(srv.http_url if protocol == "http" else srv.grpc_url)
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(A)
    inputs[1].set_data_from_numpy(B)
    result = client.infer("simple", inputs, outputs=[module.InferRequestedOutput("OUTPUT1"),
                                                     module.InferRequestedOutput("OUTPUT0")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    as_json = {"as_json": True} if protocol == "grpc" else {}
    meta = client.get_model_metadata("simple", **as_json)
    assert [t["name"] for t in meta["inputs"]] == ["INPUT0", "INPUT1"]
    assert [t["name"] for t in meta["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    stats = client.get_inference_statistics("simple", **as_json)
    assert stats["model_stats"][0]["name"] == "simple"


def test_model_names_are_not_request_names(srv):
    body = {"inputs": [{"name": "in0", "shape": [1, 16], "datatype": "INT32", "data": A.ravel().tolist()},
                       {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": B.ravel().tolist()}]}
    r = httpx.post(f"http://{srv.http_url}/v2/models/simple/infer", json=body, timeout=30)
    assert r.status_code == 400 and "unexpected inference input 'in0'" in r.json()["error"]


@pytest.mark.parametrize(("model", "words"), [
    ("fewer", "the config's inputs ['INPUT0'] are not the model's ['in0', 'in1']; taken in order, there must be as "
              "many (1 in the config, 2 in the model)"),
    ("mixed", "input[1].name 'INPUT1' is not a model input (the model's: ['in0', 'in1']), while input[0].name 'in0' "
              "is named as the model names it"),
    ("mixed_kinds", "input[0].name 'INPUT0' is not a model input (the model's: ['in0', 'in1']), while "
                    "output[0].name 'out0' is named as the model names it"),
    ("typed", "output[1].data_type TYPE_FP32 does not match the model's INT32 for 'OUTPUT1'"),
    ("shaped", "input[1].dims"),
])
def test_mismatches_fail_the_load_with_the_reason(srv, model, words):
    index = {m["name"]: m for m in httpx.post(f"http://{srv.http_url}/v2/repository/index", json={}).json()}
    assert index[model]["state"] == "UNAVAILABLE" and words in index[model]["reason"], index[model]


def test_positional_rules():
    with pytest.raises(ModelLoadError, match="'nope' is not a model input"):  # a typo, not a mapping
        check_not_mixed("m", [("input", ["nope"], ["in0"]), ("output", ["out0"], ["out0"])])
    check_not_mixed("m", [("input", ["A"], ["in0"]), ("output", ["B"], ["out0"])])
    assert positional("m", "input", ["in0", "in1"], ["in0", "in1"]) == {}
    assert positional("m", "input", [], ["in0"]) == {}
    assert positional("m", "input", ["A", "B"], ["in0", "in1"]) == {"A": "in0", "B": "in1"}
    with pytest.raises(ModelLoadError, match="there must be as many"):
        positional("m", "output", ["A"], ["out0", "out1"])
