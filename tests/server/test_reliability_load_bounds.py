"""A config cannot make a load take forever or exhaust the machine: the instance count, the warm-up's count and batch
size and a sequence state's size are bounded at load, with messages naming the model and the limit; a warm-up under
way stops when the server stops; and a load stuck in a Python model's initialize() does not keep the process alive
past --exit-timeout-secs."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from pymodels import python_model
from seqmodels import STATE_SOURCE, STATE_TEMPLATE
from serverproc import AFFINE_CONFIG, ServerProcess, make_repository

from server.config import MAX_INSTANCES, MAX_WARMUP_COUNT
from server.sequence_batching import MAX_INITIAL_STATE_BYTES

EXIT_WAIT_S = 90  # generous: far below what the stuck load would take (1000 warm-up runs of 0.5 s; 3600 s)
WARMUP = ('model_warmup [ {{ name: "w" batch_size: {batch} count: {count} inputs {{ key: "in0" value {{ '
          'data_type: TYPE_FP32 dims: [ 4 ] zero_data: true }} }} }} ]\n')


def state_model(root: Path, name: str, dims: str) -> None:
    config = STATE_TEMPLATE.format(max_batch=0, strategy="", initial="").replace("dims: [ 1 ]", f"dims: [ {dims} ]", 1)
    python_model(root, name, config, STATE_SOURCE)


def index(srv: ServerProcess) -> dict[str, dict]:
    return {m["name"]: m for m in httpx.post(f"http://{srv.http_url}/v2/repository/index", json={},
                                              timeout=10).json()}


def test_hostile_sizes_are_refused_at_load(tmp_path):
    make_repository(tmp_path, {
        "crowd": AFFINE_CONFIG.replace("count: 2", "count: 2000"),
        "endless": AFFINE_CONFIG + WARMUP.format(batch=1, count=1_000_000_000),
        "wide": AFFINE_CONFIG + WARMUP.format(batch=100_000, count=1),
        "fine": AFFINE_CONFIG + WARMUP.format(batch=8, count=MAX_WARMUP_COUNT // 100)})
    state_model(tmp_path, "huge_state", "4611686018427387904")
    state_model(tmp_path, "cube_state", "100000, 100000, 100000")
    srv = ServerProcess(tmp_path, "--exit-on-error", "false", "--strict-readiness", "false")
    try:
        models = index(srv)
        assert models["fine"]["state"] == "READY"
        reasons = {name: m.get("reason", "") for name, m in models.items()}
        assert reasons["crowd"] == (f"model 'crowd': instance_group asks for 2000 instances; at most {MAX_INSTANCES} "
                                    "per model are allowed")
        assert reasons["endless"] == (f"model 'endless': model_warmup 'w' count 1000000000 is above "
                                      f"{MAX_WARMUP_COUNT}, the most runs a warm-up may take")
        assert reasons["wide"] == ("model 'wide': model_warmup 'w' batch_size 100000 is above the model's "
                                   "max_batch_size (8)")
        assert reasons["huge_state"] == ("model 'huge_state': sequence_batching.state 'INPUT_STATE': a state of shape "
                                         "[4611686018427387904] int32 takes 18446744073709551616 bytes, above the "
                                         f"{MAX_INITIAL_STATE_BYTES} a state may hold")
        assert "a state of shape [100000, 100000, 100000] int32 takes 4000000000000000 bytes" in reasons["cube_state"]
        for name in ("crowd", "endless", "wide", "huge_state", "cube_state"):
            assert models[name]["state"] == "UNAVAILABLE"
    finally:
        assert srv.stop() == 0, srv.log_text


# A model that says it runs (a file beside it, holding its process id), then takes long: every execute (SLOW) or
# its initialize (STUCK).
SLOW_CONFIG = """
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_warmup [ { name: "long" count: 1000 inputs { key: "IN" value { data_type: TYPE_INT32 dims: [ 1 ]
                                                                     zero_data: true } } } ]
"""
SLOW_SOURCE = """
import os
from concurrent.futures import ThreadPoolExecutor
import time

import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(__file__)


class TritonPythonModel:
    def initialize(self, args):
        if {stuck}:
            self.running()
            time.sleep(3600)

    def running(self):
        with open(os.path.join(HERE, "running.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.replace(os.path.join(HERE, "running.tmp"), os.path.join(HERE, "running"))

    def execute(self, requests):
        self.running()
        time.sleep(0.5)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                            .as_numpy())]) for r in requests]
"""


def wait_running(model_dir: Path, srv: ServerProcess) -> int:
    marker = model_dir / "1" / "running"
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert time.monotonic() < deadline and srv.proc.poll() is None, srv.log_text
        time.sleep(0.05)
    return int(marker.read_text())


def stop_within(srv: ServerProcess, seconds: float) -> int:
    t0 = time.monotonic()
    code = srv.stop(timeout=seconds)
    assert time.monotonic() - t0 < seconds, srv.log_text  # else it was killed
    return code


@pytest.mark.slow
def test_sigterm_stops_a_warm_up_under_way(tmp_path):
    model_dir = python_model(tmp_path, "slow", SLOW_CONFIG, SLOW_SOURCE.replace("{stuck}", "False"))
    srv = ServerProcess(tmp_path, expect_ready=False)
    wait_running(model_dir, srv)
    assert stop_within(srv, EXIT_WAIT_S) == 0, srv.log_text
    assert "model 'slow': load cancelled during model_warmup 'long'" in srv.log_text


@pytest.mark.slow
def test_a_load_stuck_in_initialize_does_not_keep_the_server_alive(tmp_path):
    model_dir = python_model(tmp_path, "stuck", SLOW_CONFIG, SLOW_SOURCE.replace("{stuck}", "True"))
    srv = ServerProcess(tmp_path, "--exit-timeout-secs", "2", expect_ready=False)
    worker = wait_running(model_dir, srv)
    assert stop_within(srv, EXIT_WAIT_S) == 0, srv.log_text
    assert "exit timeout reached with model loads still running (stuck)" in srv.log_text
    with pytest.raises(ProcessLookupError):  # its Python process went with it
        os.kill(worker, 0)


@pytest.mark.slow
def test_an_unload_stops_a_warm_up_under_way(tmp_path):
    model_dir = python_model(tmp_path, "slow", SLOW_CONFIG, SLOW_SOURCE.replace("{stuck}", "False"))
    srv = ServerProcess(tmp_path, "--model-control-mode", "explicit")
    try:
        url = f"http://{srv.http_url}/v2/repository/models/slow"
        with ThreadPoolExecutor(1) as pool:
            load = pool.submit(httpx.post, f"{url}/load", json={}, timeout=EXIT_WAIT_S)
            wait_running(model_dir, srv)
            assert httpx.post(f"{url}/unload", json={}, timeout=EXIT_WAIT_S).status_code == 200
            answer = load.result()
        assert answer.status_code == 400 and "load cancelled during model_warmup 'long'" in answer.text, answer.text
        assert index(srv)["slow"]["state"] == "UNAVAILABLE"
    finally:
        assert srv.stop() == 0, srv.log_text


SLOW_FINALIZE = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                            .as_numpy())]) for r in requests]

    def finalize(self):
        time.sleep(8)
"""
SLOW_FINALIZE_CONFIG = """
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def test_a_slow_orderly_stop_is_not_cut_short_and_writes_its_traces(tmp_path):
    """No load is stuck, only a model's finalize takes longer than the exit timeout (8 s against 1 s): the stop
    finishes in order (the buffered traces are written) instead of the exit watchdog ending the process."""
    python_model(tmp_path / "repo", "slowfin", SLOW_FINALIZE_CONFIG, SLOW_FINALIZE)
    trace = tmp_path / "trace.json"
    srv = ServerProcess(tmp_path / "repo", "--exit-timeout-secs", "1", "--drain-delay-secs", "0",
                        "--trace-config", f"triton,file={trace}", "--trace-config", "level=TIMESTAMPS",
                        "--trace-config", "rate=1", "--trace-config", "log_frequency=0")
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}
    assert httpx.post(f"http://{srv.http_url}/v2/models/slowfin/infer", json=body, timeout=30).status_code == 200
    assert srv.stop() == 0, srv.log_text
    assert "nnserve stopped" in srv.log_text and "exiting without waiting" not in srv.log_text
    assert trace.exists() and "slowfin" in trace.read_text()
