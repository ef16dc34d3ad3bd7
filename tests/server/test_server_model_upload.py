"""Model files through the load API (Triton's `file:<version>/<name>` parameters with a `config` override): the
model loads from a private temporary directory that is gone afterwards, under a size limit, with every path kept
inside that directory; refused without the restricted API's header, or outside explicit model control."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serverproc import AFFINE_CONFIG, FIXTURES, ServerProcess, affine_reference, make_repository
from tritonclient.utils import InferenceServerException

from server.protocol.grpc import pb2, pb2_grpc
from server.repository_files import read_regular

X = np.array([[0.5, -1.0, 2.0, 1.5]], np.float32)
FILES = {f"file:1/{name}": (FIXTURES / "affine" / "1" / name).read_bytes()
         for name in ("model.pnnx.param", "model.pnnx.bin")}
LIMIT = 4096  # the fixture's files take under 1 KiB
ADMIN = ("admin-key", "secret")


def config(name: str) -> str:
    return json.dumps({"name": name, "backend": "pnnx", "max_batch_size": 4,
                       "input": [{"name": "in0", "data_type": "TYPE_FP32", "dims": [4]}],
                       "output": [{"name": "out0", "data_type": "TYPE_FP32", "dims": [3]},
                                  {"name": "out1", "data_type": "TYPE_FP32", "dims": [3]}]})


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("uploadtmp")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, tmp: Path):
    repo = make_repository(tmp_path_factory.mktemp("uploadrepo"), {"affine": AFFINE_CONFIG})
    server = ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", "affine",
                           "--model-load-max-file-size", str(LIMIT), "--http-restricted-api",
                           f"model-repository:{ADMIN[0]}={ADMIN[1]}", "--grpc-restricted-protocol",
                           f"model-repository:{ADMIN[0]}={ADMIN[1]}", env={"TMPDIR": str(tmp)})
    yield server
    assert server.stop() == 0, server.log_text


def check_serves(srv: ServerProcess, model: str) -> None:
    client = httpclient.InferenceServerClient(srv.http_url)
    inp = httpclient.InferInput("in0", [1, 4], "FP32")
    inp.set_data_from_numpy(X)
    np.testing.assert_allclose(client.infer(model, [inp]).as_numpy("out1"), affine_reference(X)["out1"], rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_loads_from_the_files_of_the_request(srv, tmp, protocol):
    name = f"uploaded_{protocol}"
    if protocol == "http":
        client = httpclient.InferenceServerClient(srv.http_url)
        client.load_model(name, headers=dict([ADMIN]), config=config(name), files=FILES)
    else:
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        client.load_model(name, headers={f"triton-grpc-protocol-{ADMIN[0]}": ADMIN[1]}, config=config(name),
                          files=FILES)
    check_serves(srv, name)
    assert list(tmp.iterdir()) == []  # the private directory is gone once the model is loaded
    index = {m["name"]: m for m in httpx.post(f"http://{srv.http_url}/v2/repository/index", json={},
                                              headers=dict([ADMIN])).json()}
    assert index[name]["state"] == "READY"


def load(srv: ServerProcess, name: str, params: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"http://{srv.http_url}/v2/repository/models/{name}/load", json={"parameters": params},
                      headers=dict([ADMIN]) if headers is None else headers, timeout=60)


def encoded(files: dict[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode() for k, v in files.items()}


@pytest.mark.parametrize("key", ["file:../escaped", "file:/tmp/escaped", "file:1/../../escaped", "file:1//x",
                                 "file:./1/x", "file:" + "A" * 256, "file:", "file:1\\..\\x"])
def test_paths_stay_inside_the_private_directory(srv, tmp, key):
    r = load(srv, "sneaky", {"config": config("sneaky"), key: "AAAA", **encoded(FILES)})
    # Triton's code and words (its newest client example matches both for a name over NAME_MAX)
    assert r.status_code == 500, r.text
    assert r.json()["error"].startswith("failed to load 'sneaky', failed to poll from model repository")
    assert "must stay within the model directory" in r.json()["error"]
    assert list(tmp.iterdir()) == [] and not (tmp.parent / "escaped").exists()
    assert not Path("/tmp/escaped").exists()


def test_size_limit_and_other_refusals(srv, tmp):
    big = {"file:1/model.pnnx.param": b"x" * (LIMIT + 1)}
    r = load(srv, "big", {"config": config("big"), **encoded(big)})
    assert r.status_code == 500 and "--model-load-max-file-size" in r.json()["error"]
    r = httpx.post(f"http://{srv.http_url}/v2/repository/models/big/load", headers=dict([ADMIN]),
                   content=b'{"parameters": {"file:1/x": "' + b"A" * (2**21) + b'"}}', timeout=60)
    assert r.status_code == 413  # the body itself is over what the limit allows
    r = load(srv, "noconfig", encoded(FILES))
    assert r.status_code == 500 and "Load parameter 'config' must be specified" in r.json()["error"]
    r = load(srv, "notbase64", {"config": config("notbase64"), "file:1/model.pnnx.param": "%%%"})
    assert r.status_code == 400 and "invalid base64" in r.json()["error"]
    r = load(srv, "dup", {"config": config("dup"), "file:1/model.pnnx.param/x": "AAAA", **encoded(FILES)})
    assert r.status_code == 500 and "already taken" in r.json()["error"]
    # files that make no model: the model's own load error, and no trace of the directory
    r = load(srv, "broken", {"config": config("broken"), "file:1/model.pnnx.param": "AAAA"})
    assert r.status_code == 400 and "model 'broken'" in r.json()["error"]
    assert list(tmp.iterdir()) == []
    with grpc.insecure_channel(srv.grpc_url) as channel:
        request = pb2.RepositoryModelLoadRequest(model_name="typed")
        request.parameters["config"].string_param = config("typed")
        request.parameters["file:1/model.pnnx.param"].string_param = "not bytes"
        with pytest.raises(grpc.RpcError) as info:
            pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(
                request, metadata=((f"triton-grpc-protocol-{ADMIN[0]}", ADMIN[1]),), timeout=60)
    assert "File parameter 'file:1/model.pnnx.param' must have bytes type" in info.value.details()


def test_the_restricted_api_refuses_before_reading(srv):
    r = load(srv, "anon", {"config": config("anon"), **encoded(FILES)}, headers={})
    assert r.status_code == 403 and "This API is restricted" in r.json()["error"]
    with pytest.raises(InferenceServerException, match="This protocol is restricted"):
        grpcclient.InferenceServerClient(srv.grpc_url).load_model("anon", config=config("anon"), files=FILES)
    r = httpx.get(f"http://{srv.http_url}/v2/models/anon/ready", timeout=10)
    assert r.status_code == 400  # not ready: nothing was loaded
    assert httpx.get(f"http://{srv.http_url}/v2/models/anon", timeout=10).status_code == 404


def test_uploaded_files_replace_a_repository_model_for_that_load_only(srv, tmp):
    """A load with files uses them, not the repository's directory, which it leaves untouched; a later load
    without files reads the repository again."""
    repo_param = srv.proc.args[srv.proc.args.index("--model-repository") + 1]
    own = Path(repo_param) / "affine" / "1" / "model.pnnx.param"
    before = read_regular(own, 1 << 20, "param")
    r = load(srv, "affine", {"config": config("affine"), **encoded(FILES)})
    assert r.status_code == 200, r.text
    check_serves(srv, "affine")
    assert read_regular(own, 1 << 20, "param") == before and list(tmp.iterdir()) == []
    assert load(srv, "affine", {}).status_code == 200
    check_serves(srv, "affine")


def test_refused_outside_explicit_model_control(server):
    r = httpx.post(f"http://{server.http_url}/v2/repository/models/x/load",
                   json={"parameters": {"config": config("x"), **encoded(FILES)}}, timeout=30)
    assert r.status_code == 400 and "model control is not enabled" in r.json()["error"]
