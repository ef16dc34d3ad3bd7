"""Repository faults take down the faulty model only: each fails alone, with its reason in the repository index and
the log, while the server and the other models serve on. Readiness follows Triton's rules: with
--strict-readiness=true (the default) the server is ready when every model it was asked to serve is READY (a model
unloaded on request does not count; a name that is not in the repository leaves no trace), with false as soon as it
has started."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serverproc import AFFINE_CONFIG, FIXTURES, ServerProcess, affine_reference, make_repository

from server.protocol.grpc import pb2, pb2_grpc

pytestmark = pytest.mark.slow  # starts its own servers

HOLD_ROW = [1e26] * 4  # held at tests/server/held_ops.py's gate (a plugin of the server, never imported here)
NOT_UTF8 = AFFINE_CONFIG.encode() + b"# caf\xe9, written in Latin-1\n"
X = np.array([[0.5, -1.0, 2.0, 1.5]], np.float32)


def warmup_config(name: str, data: str) -> str:
    return AFFINE_CONFIG + ("model_warmup [ { name: \"w\" batch_size: 1 inputs { key: \"in0\" value { data_type: "
                            f"TYPE_FP32 dims: [ 4 ] {data} }} }} }} ]\n")


def faulty_repository(root: Path) -> Path:
    """affine serves; every other model is broken in its own way."""
    repo = make_repository(root, {"affine": AFFINE_CONFIG, "latin1": None, "warmup_missing": warmup_config(
        "warmup_missing", 'input_data_file: "nothing_here"'), "warmup_short": warmup_config(
        "warmup_short", 'input_data_file: "short"'), "fifo_config": None, "fifo_weights": AFFINE_CONFIG,
        "huge_config": None, "extra_fifo": AFFINE_CONFIG, "warmup_fault": warmup_config(
        "warmup_fault", 'input_data_file: "poison"')})
    (repo / "warmup_fault" / "warmup").mkdir()  # a kernel raises on it (tests/server/faulty_ops.py)
    (repo / "warmup_fault" / "warmup" / "poison").write_bytes(np.full(4, 1e36, np.float32).tobytes())
    (repo / "latin1" / "config.pbtxt").write_bytes(NOT_UTF8.replace(b'"affine"', b'"latin1"'))
    (repo / "warmup_short" / "warmup").mkdir()
    (repo / "warmup_short" / "warmup" / "short").write_bytes(b"\0" * 12)  # 3 floats, the sample needs 4
    os.mkfifo(repo / "fifo_config" / "config.pbtxt")  # nobody ever writes to it: a read would block forever
    (repo / "fifo_weights" / "1" / "model.pnnx.bin").unlink()
    os.mkfifo(repo / "fifo_weights" / "1" / "model.pnnx.bin")
    with open(repo / "huge_config" / "config.pbtxt", "wb") as f:  # sparse: 1 GiB that takes no disk
        f.truncate(2**30)
    os.mkfifo(repo / "extra_fifo" / "1" / "notes")  # a FIFO nobody reads: harmless
    return repo


REASONS = {  # model -> words its reason (index and log) must hold
    "latin1": "latin1/config.pbtxt: not UTF-8 text: byte 0xe9 at offset",
    "warmup_missing": "warmup/nothing_here: cannot read: No such file or directory",
    "warmup_short": "warmup/short holds 12 bytes, expected 16",
    "fifo_config": "fifo_config/config.pbtxt is a FIFO, not a regular file",
    "fifo_weights": "1/model.pnnx.bin is a FIFO, not a regular file",
    "huge_config": "huge_config/config.pbtxt has 1073741824 bytes, more than the",
    "warmup_fault": "model_warmup 'w' failed: ",
}
# held_ops first: faulty_ops then wraps it, so a poisoned run raises before any gate could hold it
PLUGINS = {"NNSERVE_PLUGINS": "held_ops,faulty_ops", "PYTHONPATH": str(Path(__file__).resolve().parent)}


def wait_started(srv: ServerProcess, timeout: float = 120) -> None:
    """Until the initial loads are done (the server logs its summary line), whatever their outcome."""
    deadline = time.monotonic() + timeout
    while "model(s) ready" not in srv.log_text:
        assert srv.proc.poll() is None, srv.log_text
        assert time.monotonic() < deadline, "startup did not finish (a read blocked?):\n" + srv.log_text
        time.sleep(0.1)


def index(srv: ServerProcess) -> dict[str, dict]:
    return {row["name"]: row for row in httpx.post(f"http://{srv.http_url}/v2/repository/index", json={}).json()}


def infer(srv: ServerProcess, model: str = "affine") -> httpx.Response:
    body = {"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": X.ravel().tolist()}]}
    return httpx.post(f"http://{srv.http_url}/v2/models/{model}/infer", json=body, timeout=60)


def assert_serves(srv: ServerProcess, model: str = "affine") -> None:
    r = infer(srv, model)
    assert r.status_code == 200, r.text
    out = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}
    np.testing.assert_allclose(out["out0"], affine_reference(X)["out0"], rtol=1e-5, atol=1e-6)


def ready(srv: ServerProcess) -> bool:
    http_ready = httpclient.InferenceServerClient(srv.http_url).is_server_ready()
    assert grpcclient.InferenceServerClient(srv.grpc_url).is_server_ready() == http_ready
    return http_ready


@pytest.mark.parametrize("strict", [True, False])
def test_broken_models_fail_alone_at_startup(tmp_path, strict):
    repo = faulty_repository(tmp_path / "repo")
    srv = ServerProcess(repo, "--exit-on-error=false", f"--strict-readiness={str(strict).lower()}",
                        expect_ready=False, env={**PLUGINS, "NNSERVE_TEST_GATE": str(tmp_path)})
    try:
        wait_started(srv)
        rows = index(srv)
        assert rows["affine"]["state"] == "READY" and rows["extra_fifo"]["state"] == "READY"
        for model, words in REASONS.items():
            assert rows[model]["state"] == "UNAVAILABLE" and words in rows[model]["reason"], rows[model]
            errors = [ln for ln in srv.log if " ERROR " in ln[:40] and f"model '{model}'" in ln]
            assert len(errors) == 1 and words in errors[0], srv.log_text
        table = srv.log_text.split("models:\n", 1)[1]
        for model in REASONS:
            assert f"| {model} " in table and "UNAVAILABLE: " in table
        assert_serves(srv)
        assert_serves(srv, "extra_fifo")
        assert ready(srv) is not strict  # Triton: strict readiness needs every model READY
        assert srv.proc.poll() is None
    finally:
        assert srv.stop() == 0, srv.log_text


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory):
    """Explicit mode with affine loaded; `gated`'s warm-up holds its load at the gate of tests/server/held_ops.py."""
    root = tmp_path_factory.mktemp("explicit")
    gate = root / "gate"
    gate.mkdir()
    repo = faulty_repository(root / "repo")
    for name in ("gated_grpc", "gated_http"):
        shutil.copytree(FIXTURES / "affine", repo / name)
        (repo / name / "config.pbtxt").write_text(warmup_config(name, 'input_data_file: "hold"').replace(
            '"affine"', f'"{name}"'))
        (repo / name / "warmup").mkdir()
        (repo / name / "warmup" / "hold").write_bytes(np.array(HOLD_ROW, np.float32).tobytes())
    env = {**PLUGINS, "NNSERVE_TEST_GATE": str(gate)}
    srv = ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", "affine", env=env)
    srv.gate = gate
    yield srv
    (gate / "open").touch()
    assert srv.stop() == 0, srv.log_text


def test_loading_a_name_the_repository_does_not_have(explicit):
    for _ in range(2):
        r = httpx.post(f"http://{explicit.http_url}/v2/repository/models/ghost/load", timeout=60)
        # Triton 2.51's answer, which clients match
        assert r.status_code == 500 and r.json()["error"] == "failed to load 'ghost', failed to poll from model " \
            "repository", r.text
    with pytest.raises(grpc.RpcError) as info:
        with grpc.insecure_channel(explicit.grpc_url) as channel:
            pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(
                pb2.RepositoryModelLoadRequest(model_name="ghost"), timeout=60)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert info.value.details() == "failed to load 'ghost', failed to poll from model repository"
    assert "ghost" not in index(explicit)  # no trace: not in the index, not counted by readiness
    assert ready(explicit)
    assert_serves(explicit)


@pytest.mark.parametrize("model", sorted(REASONS))
def test_load_api_errors_leave_the_model_unavailable_with_its_reason(explicit, model):
    r = httpx.post(f"http://{explicit.http_url}/v2/repository/models/{model}/load", timeout=60)
    assert r.status_code == 400 and REASONS[model] in r.json()["error"], r.text
    row = index(explicit)[model]
    assert row["state"] == "UNAVAILABLE" and REASONS[model] in row["reason"], row
    assert not ready(explicit)  # asked for and not READY: strict readiness fails, as in Triton
    assert_serves(explicit)
    r = httpx.post(f"http://{explicit.http_url}/v2/repository/models/{model}/unload", timeout=60)
    assert r.status_code == 200, r.text
    assert index(explicit)[model]["reason"] == "unloaded" and ready(explicit)


def test_a_load_whose_caller_goes_away_still_ends(explicit):
    """The gRPC deadline of one load and the HTTP client of another expire while the model warms up: each load
    goes on, the model is LOADING meanwhile (others serve), and READY once its warm-up can finish."""
    with grpc.insecure_channel(explicit.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as info:
            pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(
                pb2.RepositoryModelLoadRequest(model_name="gated_grpc"), timeout=1.0)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"http://{explicit.http_url}/v2/repository/models/gated_http/load", timeout=1.0)
    deadline = time.monotonic() + 60
    while len(list(explicit.gate.glob("entered-*"))) < 2:  # both warm-ups are held
        assert time.monotonic() < deadline, explicit.log_text
        time.sleep(0.05)
    rows = index(explicit)
    assert rows["gated_grpc"]["state"] == rows["gated_http"]["state"] == "LOADING"
    assert_serves(explicit)
    (explicit.gate / "open").touch()
    while not all(index(explicit)[m].get("state") == "READY" for m in ("gated_grpc", "gated_http")):
        assert time.monotonic() < deadline, explicit.log_text
        time.sleep(0.05)
    assert_serves(explicit, "gated_grpc")
    assert_serves(explicit, "gated_http")


def test_poll_mode_polls_on_past_a_bad_model(tmp_path):
    """In poll mode a broken model (sorted first) neither stops the others from loading nor the poll from
    unloading a removed model and loading a new one; a FIFO added later does not block a poll."""
    repo = make_repository(tmp_path / "repo", {"aaa_latin1": None, "zzz": AFFINE_CONFIG})
    (repo / "aaa_latin1" / "config.pbtxt").write_bytes(NOT_UTF8.replace(b'"affine"', b'"aaa_latin1"'))
    srv = ServerProcess(repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.2",
                        "--exit-on-error=false", "--strict-readiness=false")
    try:
        assert index(srv)["zzz"]["state"] == "READY"
        staging = tmp_path / "staging"
        shutil.copytree(FIXTURES / "affine", staging)
        (staging / "config.pbtxt").write_text(AFFINE_CONFIG.replace('"affine"', '"mmm_new"'))
        staging.rename(repo / "mmm_new")
        shutil.copytree(FIXTURES / "affine", repo / "fifo")
        os.mkfifo(repo / "fifo" / "config.pbtxt")
        shutil.rmtree(repo / "zzz")
        deadline = time.monotonic() + 60
        while not (index(srv).get("mmm_new", {}).get("state") == "READY" and "zzz" not in index(srv)
                   and "FIFO" in index(srv).get("fifo", {}).get("reason", "")):
            assert time.monotonic() < deadline and srv.proc.poll() is None, srv.log_text
            time.sleep(0.1)
        rows = index(srv)
        assert rows["aaa_latin1"]["state"] == "UNAVAILABLE" and "not UTF-8" in rows["aaa_latin1"]["reason"]
        assert_serves(srv, "mmm_new")
        assert httpx.get(f"http://{srv.http_url}/v2/models/zzz/ready").status_code != 200
        assert "repository poll failed" not in srv.log_text
    finally:
        assert srv.stop() == 0, srv.log_text


def test_a_load_config_that_is_not_json_is_a_400(explicit):
    r = httpx.post(f"http://{explicit.http_url}/v2/repository/models/affine/load", timeout=60,
                   json={"parameters": {"config": "[" * 100000}})  # too deep for json
    assert r.status_code == 400 and "the 'config' parameter: JSON nested too deeply" in r.json()["error"], r.text
    r = httpx.post(f"http://{explicit.http_url}/v2/repository/models/affine/load", timeout=60,
                   json={"parameters": {"config": json.dumps({"name": "affine", "max_batch_size": "many"})}})
    assert r.status_code == 400, r.text
    assert_serves(explicit)
