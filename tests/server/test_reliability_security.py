"""Security: model control off unless explicit, restricted API groups (Triton's flags, codes and messages), the load
API kept inside the repository root, and tensor contents out of the logs unless verbose logging asks for them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from serverproc import AFFINE_CONFIG, FIXTURES, ServerProcess, make_repository, nnserve_command

from server.protocol.grpc import pb2, pb2_grpc

pytestmark = pytest.mark.slow  # starts its own server

ADMIN = ("admin-key", "s3cret")
GRPC_ADMIN = (("triton-grpc-protocol-admin-key", "s3cret"),)
SENTINEL = 7777.125  # a value no log line has any reason to contain
SENTINEL_TEXT = "SENTINEL-9f3a"


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """A directory next to the repository (not in it) holding a valid model and a secret file."""
    root = tmp_path_factory.mktemp("outside")
    shutil.copytree(FIXTURES / "affine", root / "model")
    (root / "secret.txt").write_text("do not read")
    return root


@pytest.fixture(scope="module")
def restricted(tmp_path_factory, outside: Path):
    repo = make_repository(tmp_path_factory.mktemp("secrepo"), {"affine": AFFINE_CONFIG, "plain": None})
    os.symlink(outside / "model", repo / "evil")  # a model directory that is a symlink out of the root
    shutil.copytree(FIXTURES / "affine", repo / "sneaky")
    (repo / "sneaky" / "1" / "model.pnnx.bin").unlink()  # one model file that is a symlink out of the root
    os.symlink(outside / "model" / "1" / "model.pnnx.bin", repo / "sneaky" / "1" / "model.pnnx.bin")
    spec = f"model-repository,statistics:{ADMIN[0]}={ADMIN[1]}"
    srv = ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", "affine",
                        "--http-restricted-api", spec, "--grpc-restricted-protocol", spec, "--log-verbose", "2")
    yield srv
    assert srv.stop() == 0, srv.log_text


def url(srv: ServerProcess, path: str) -> str:
    return f"http://{srv.http_url}{path}"


# ---- model control off unless explicit ---------------------------------------------------------------------------
def test_model_control_refused_unless_explicit(server: ServerProcess) -> None:
    """The session server runs with --model-control-mode none (the default)."""
    for action in ("load", "unload"):
        r = httpx.post(url(server, f"/v2/repository/models/affine/{action}"), timeout=30)
        assert r.status_code == 400 and "not allowed" in r.json()["error"], r.text
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.RepositoryModelUnload(pb2.RepositoryModelUnloadRequest(model_name="affine"), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not allowed" in info.value.details()
    assert httpx.get(url(server, "/v2/models/affine/ready"), timeout=10).status_code == 200


# ---- restricted APIs ---------------------------------------------------------------------------------------------
def test_http_restricted_api_needs_the_header(restricted: ServerProcess) -> None:
    for method, path in (("POST", "/v2/repository/index"), ("POST", "/v2/repository/models/plain/load"),
                         ("GET", "/v2/models/affine/stats"), ("GET", "/v2/models/stats")):
        for headers in ({}, {ADMIN[0]: "wrong"}):
            r = httpx.request(method, url(restricted, path), headers=headers, timeout=30)
            assert r.status_code == 403, (path, r.text)
            assert r.json() == {"error": f"This API is restricted, expecting header '{ADMIN[0]}'"}
    assert httpx.post(url(restricted, "/v2/repository/index"), headers=dict([ADMIN]), timeout=30).status_code == 200
    # groups that are not restricted need nothing
    assert httpx.get(url(restricted, "/v2/health/ready"), timeout=10).status_code == 200
    assert httpx.get(url(restricted, "/v2/models/affine/config"), timeout=10).status_code == 200
    body = {"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    assert httpx.post(url(restricted, "/v2/models/affine/infer"), json=body, timeout=30).status_code == 200
    client = httpclient.InferenceServerClient(restricted.http_url)  # Triton's client passes headers through
    client.load_model("plain", headers=dict([ADMIN]))
    assert client.is_model_ready("plain")


def test_grpc_restricted_protocol_needs_the_metadata(restricted: ServerProcess) -> None:
    with grpc.insecure_channel(restricted.grpc_url) as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        for call, req in ((stub.RepositoryIndex, pb2.RepositoryIndexRequest()),
                          (stub.ModelStatistics, pb2.ModelStatisticsRequest(name="affine")),
                          (stub.RepositoryModelLoad, pb2.RepositoryModelLoadRequest(model_name="plain"))):
            for metadata in ((), (("triton-grpc-protocol-admin-key", "nope"),), (ADMIN,)):
                with pytest.raises(grpc.RpcError) as info:
                    call(req, metadata=metadata, timeout=30)
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE
                assert info.value.details() == ("This protocol is restricted, expecting header "
                                                "'triton-grpc-protocol-admin-key'")
        assert stub.RepositoryIndex(pb2.RepositoryIndexRequest(), metadata=GRPC_ADMIN, timeout=30).models
        assert stub.ServerReady(pb2.ServerReadyRequest(), timeout=10).ready  # health is not restricted
        req = pb2.ModelInferRequest(model_name="affine")
        req.inputs.add(name="in0", datatype="FP32", shape=[1, 4])
        req.raw_input_contents.append(np.ones(4, np.float32).tobytes())
        assert len(stub.ModelInfer(req, timeout=30).raw_output_contents) == 2


@pytest.mark.parametrize("spec", ["model-repository", "bogus:k=v", "inference:novalue", "health,health:k=v"])
def test_malformed_restriction_flags_stop_the_server(tmp_path: Path, spec: str) -> None:
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG})
    proc = subprocess.run([*nnserve_command(), "serve", "--model-repository", str(repo), "--http-port", "0",
                           "--grpc-port", "0", "--metrics-port", "0", "--http-restricted-api", spec],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--http-restricted-api" in proc.stderr, proc.stderr


# ---- the load API stays inside the repository ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["..", "../affine", "/etc", "a/../../b", "~root", ".", "x\\..\\y", "/tmp/evil"])
def test_load_refuses_names_that_are_paths(restricted: ServerProcess, name: str) -> None:
    with grpc.insecure_channel(restricted.grpc_url) as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.RepositoryModelLoad(pb2.RepositoryModelLoadRequest(model_name=name), metadata=GRPC_ADMIN,
                                     timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "invalid model name" in info.value.details()


def test_load_refuses_encoded_traversal_over_http(restricted: ServerProcess) -> None:
    for path in ("/v2/repository/models/%2e%2e/load", "/v2/repository/models/..%2Fevil/load",
                 "/v2/repository/models/%2Fetc/load"):
        r = httpx.post(url(restricted, path), headers=dict([ADMIN]), timeout=30)
        assert r.status_code in (400, 404), r.text  # a 404 means no route matched: nothing was loaded
        assert r.status_code == 404 or "invalid model name" in r.json()["error"]


@pytest.mark.parametrize(("model", "words"), [("evil", "evil/ resolves outside"),
                                              ("sneaky", "1/model.pnnx.bin resolves outside")])
def test_load_refuses_symlinks_out_of_the_root(restricted: ServerProcess, model: str, words: str) -> None:
    r = httpx.post(url(restricted, f"/v2/repository/models/{model}/load"), headers=dict([ADMIN]), timeout=30)
    assert r.status_code == 400 and words in r.json()["error"], r.text
    r = httpx.get(url(restricted, f"/v2/models/{model}/ready"), timeout=10)
    assert r.status_code == 400 and r.json()["error"] == "Model version not ready"  # Triton's answer
    r = httpx.get(url(restricted, f"/v2/models/{model}"), timeout=10)
    assert r.status_code == 404 and "has no available versions" in r.json()["error"]  # Triton's answer


def test_load_refuses_file_overrides_and_warmup_files_outside(restricted: ServerProcess, outside: Path) -> None:
    load = url(restricted, "/v2/repository/models/plain/load")
    for key in ("file:../../escaped", "file:/tmp/escaped", "file:1/../../../escaped"):  # files stay in their directory
        r = httpx.post(load, headers=dict([ADMIN]), json={"parameters": {"config": "{}", key: "AAAA"}}, timeout=30)
        assert r.status_code == 500 and "must stay within the model directory" in r.json()["error"], r.text
        assert not (outside / "escaped").exists() and not Path("/tmp/escaped").exists()
    warmup = {"name": "plain", "max_batch_size": 2, "model_warmup": [{"name": "w", "batch_size": 1, "inputs": {
        "in0": {"data_type": "TYPE_FP32", "dims": [4], "input_data_file": str(outside / "secret.txt")}}}]}
    for path in (str(outside / "secret.txt"), "../../secret.txt"):
        warmup["model_warmup"][0]["inputs"]["in0"]["input_data_file"] = path
        r = httpx.post(load, headers=dict([ADMIN]), json={"parameters": {"config": json.dumps(warmup)}}, timeout=30)
        assert r.status_code == 400 and "is outside warmup/" in r.json()["error"], r.text


# ---- logs ----------------------------------------------------------------------------------------------------------
def send_sentinels(srv: ServerProcess) -> None:
    """The sentinel in good and bad requests over both protocols."""
    x = [SENTINEL, 1.0, 2.0, 3.0]
    for data, shape in ((x, [1, 4]), (x + [0.0], [1, 5]), ([SENTINEL_TEXT] * 4, [1, 4])):
        body = {"id": "req", "inputs": [{"name": "in0", "shape": shape, "datatype": "FP32", "data": data}]}
        httpx.post(url(srv, "/v2/models/affine/infer"), json=body, timeout=30)
    with grpc.insecure_channel(srv.grpc_url) as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        for raw, shape in ((np.array(x, np.float32).tobytes(), [1, 4]), (np.array(x, np.float32).tobytes(), [4])):
            req = pb2.ModelInferRequest(model_name="affine")
            req.inputs.add(name="in0", datatype="FP32", shape=shape)
            req.raw_input_contents.append(raw)
            try:
                stub.ModelInfer(req, timeout=30)
            except grpc.RpcError:
                pass


def test_logs_hold_no_tensor_contents_by_default(server: ServerProcess) -> None:
    send_sentinels(server)
    text = server.log_text
    assert str(SENTINEL) not in text and SENTINEL_TEXT not in text


def test_verbose_logging_shows_tensor_contents(restricted: ServerProcess) -> None:
    send_sentinels(restricted)
    assert str(SENTINEL) in restricted.log_text  # --log-verbose 2 asked for them
