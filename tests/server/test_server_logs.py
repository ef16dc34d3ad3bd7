"""The server's log reads like Triton's, on a real server's captured stderr: a line per model state change, the
table of models once start-up loads are done, no engine planning notes at INFO, no library debug noise at
--log-verbose 1 (grpc's "Loaded running loop"), no raw grpc error before ours for a taken port, and --log-format
json gives one JSON object per line."""

from __future__ import annotations

import json
import re
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from serverproc import AFFINE_CONFIG, ServerProcess, make_repository

pytestmark = pytest.mark.slow  # starts its own servers

OUR_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")
TABLE_LINE = re.compile(r"[|+]")


def foreign_lines(srv: ServerProcess) -> list[str]:
    """Lines that are neither ours (time, level, logger) nor rows of the model table."""
    return [ln for ln in srv.log if not OUR_LINE.match(ln) and not TABLE_LINE.match(ln)]


def infer_grpc(srv: ServerProcess, model: str, n: int = 12) -> None:
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    inp = grpcclient.InferInput("in0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.ones((1, 4), np.float32))
    with ThreadPoolExecutor(4) as pool:
        for result in pool.map(lambda _: client.infer(model, [inp]), range(n)):
            assert result.as_numpy("out0").shape == (1, 3)


@pytest.fixture
def repo(tmp_path):
    """affine (2 CPU instances), one model that fails to load, one without config.pbtxt."""
    return make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG, "auto": None,
                                               "broken": AFFINE_CONFIG.replace('"in0"', '"nope"')})


def test_info_log_reads_like_tritons(repo):
    srv = ServerProcess(repo, "--exit-on-error=false", "--strict-readiness=false", "--model-control-mode",
                        "explicit", "--load-model", "*")
    try:
        infer_grpc(srv, "affine")
        assert httpx.post(f"http://{srv.http_url}/v2/repository/models/auto/unload").status_code == 200
    finally:
        assert srv.stop() == 0, srv.log_text
    text = srv.log_text
    assert foreign_lines(srv) == [], text
    assert not [ln for ln in srv.log if " engine." in ln[:60]], text  # blocked-layout statistics are debug detail
    # one line per state change of each model
    for model in ("affine", "auto", "broken"):
        assert len([ln for ln in srv.log if f"INFO nnserve.repository: loading model '{model}'" in ln]) == 1, text
    loaded = [ln for ln in srv.log if "loaded model 'affine' version 1: READY (pnnx, max_batch_size 8, " in ln]
    assert len(loaded) == 1 and "2 instances on cpu," in loaded[0] and "cpu, cpu" not in text, text
    assert len([ln for ln in srv.log if "loaded model 'auto' version 1: READY" in ln and "1 instance on cpu," in ln
                ]) == 1, text
    failed = [ln for ln in srv.log if OUR_LINE.match(ln) and "model 'broken'" in ln]
    assert len(failed) == 2 and " ERROR " in failed[1] and "UNAVAILABLE: model 'broken': input[0].name 'nope'" in \
        failed[1], text  # loading, then the failure with its reason
    assert len([ln for ln in srv.log if "model 'auto' UNAVAILABLE: unloaded" in ln]) == 1, text
    # the table of models, once, after the start-up loads
    assert text.count("| Model ") == 1
    table = text.split("models:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [cell.strip() for cell in table[1].split("|")[1:4]] == ["Model", "Version", "Status"], table
    rows = {cells[1].strip(): (cells[2].strip(), cells[3].strip()) for cells in
            (ln.split("|") for ln in table if ln.startswith("| ") and "Model" not in ln)}
    assert rows["affine"] == ("1", "READY") and rows["auto"] == ("1", "READY")
    assert rows["broken"][1].startswith("UNAVAILABLE: model 'broken': input[0].name 'nope'"), rows


def test_verbose_log_has_no_library_noise(repo):
    srv = ServerProcess(repo, "--log-verbose", "1", "--exit-on-error=false", "--strict-readiness=false")
    try:
        infer_grpc(srv, "affine", n=24)  # grpc logs "Loaded running loop" per thread at DEBUG
    finally:
        assert srv.stop() == 0, srv.log_text
    text = srv.log_text
    assert "Loaded running loop" not in text and " DEBUG grpc" not in text and " DEBUG asyncio" not in text, text
    assert " DEBUG engine." in text or " INFO engine." in text  # verbose shows the engine's notes
    assert foreign_lines(srv) == [], text


def test_json_log_format(repo):
    srv = ServerProcess(repo, "--log-format", "json", "--exit-on-error=false", "--strict-readiness=false")
    try:
        infer_grpc(srv, "affine", n=2)
    finally:
        assert srv.stop() == 0, srv.log_text
    records = [json.loads(ln) for ln in srv.log]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    messages = [r["message"] for r in records]
    assert any(m.startswith("nnserve listening: http=") for m in messages)
    assert any(m.startswith("models:\n+") and "| affine " in m for m in messages)  # the table is one record
    failure = next(r for r in records if r["message"].startswith("model 'broken' UNAVAILABLE"))
    assert failure["level"] == "ERROR" and failure["logger"] == "nnserve.repository"
    assert records[0]["time"].endswith("+00:00")


def test_a_taken_grpc_port_is_one_line_of_ours(repo):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as another gRPC server holds its port
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        port = sock.getsockname()[1]
        srv = ServerProcess(repo, "--grpc-port", str(port), expect_ready=False)
        assert srv.proc.wait(60) == 1
    finally:
        sock.close()
    srv.stop()
    assert len(srv.log) == 1 and f"ERROR nnserve: cannot listen on 127.0.0.1:{port} (gRPC)" in srv.log[0], \
        srv.log_text
