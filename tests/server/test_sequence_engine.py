"""A sequence model run by the engine (a PNNX graph whose inputs include the control and state tensors), against a
real server with tritonclient: a running sum kept in implicit state, reset by START, with sequences in parallel
(their requests batched together) on the direct and oldest strategies; auto-complete leaves the control and state
tensors out of the config's inputs and outputs; a control or state the graph does not have is a load error. The
reference is a running sum in numpy."""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serverproc import ServerProcess

# out0 = out1 = in0 + in2 * (1 - in1): in0 the value, in1 START (1.0 on a sequence's first request), in2 the state
PARAM = """7767517
6 6
pnnx.Input               pnnx_input_0             0 1 0 #0=(?,1)f32
pnnx.Input               pnnx_input_1             0 1 1 #1=(?,1)f32
pnnx.Input               pnnx_input_2             0 1 2 #2=(?,1)f32
pnnx.Expression pnnx_expr_0 3 1 0 1 2 3 expr=add(@0,mul(@2,sub(1,@1))) #0=(?,1)f32 #1=(?,1)f32 #2=(?,1)f32 #3=(?,1)f32
pnnx.Expression pnnx_expr_1 3 1 0 1 2 4 expr=add(@0,mul(@2,sub(1,@1))) #0=(?,1)f32 #1=(?,1)f32 #2=(?,1)f32 #4=(?,1)f32
pnnx.Output              pnnx_output_0            2 0 3 4 #3=(?,1)f32 #4=(?,1)f32
"""

SEQUENCE_BLOCK = """
sequence_batching {{
  {strategy}
  control_input [ {{ name: "in1" control [ {{ kind: CONTROL_SEQUENCE_START {values} }} ] }} ]
  state [ {{ input_name: "{state}" output_name: "out1" data_type: TYPE_FP32 dims: [ 1 ] }} ]
}}
"""
FULL = """
max_batch_size: 4
input [ { name: "in0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "out0" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""


def write_model(root: Path, name: str, config: str) -> None:
    version = root / name / "1"
    version.mkdir(parents=True)
    (version / "model.pnnx.param").write_text(PARAM)
    with zipfile.ZipFile(version / "model.pnnx.bin", "w"):
        pass  # no weights
    (root / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "pnnx"\n' + config)


def block(strategy: str = "", values: str = "fp32_false_true: [ 0, 1 ]", state: str = "in2") -> str:
    return SEQUENCE_BLOCK.format(strategy=strategy, values=values, state=state)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("seqengine")
    write_model(root, "sum_direct", FULL + block("direct { }"))
    write_model(root, "sum_oldest", FULL + block("oldest { max_candidate_sequences: 3 }"))
    write_model(root, "sum_auto", "max_batch_size: 4\n" + block())
    write_model(root, "no_such_control", FULL + block().replace('name: "in1"', 'name: "START"'))
    write_model(root, "wrong_type", FULL + block(values="int32_false_true: [ 0, 1 ]"))
    write_model(root, "no_such_state", FULL + block(state="STATE"))
    srv = ServerProcess(root, "--exit-on-error", "false", "--strict-readiness", "false")
    yield srv
    assert srv.stop() == 0, srv.log_text


def run_sequence(srv: ServerProcess, protocol: str, model: str, sid: int, values: list[float]) -> list[float]:
    mod = httpclient if protocol == "http" else grpcclient
    c = mod.InferenceServerClient(srv.http_url if protocol == "http" else srv.grpc_url)
    got = []
    for i, value in enumerate(values):
        inp = mod.InferInput("in0", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[value]], np.float32))
        result = c.infer(model, [inp], sequence_id=sid, sequence_start=i == 0, sequence_end=i == len(values) - 1)
        assert result.as_numpy("out1") is None  # the state output stays in the server
        got.append(float(result.as_numpy("out0")[0][0]))
    return got


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["sum_direct", "sum_oldest", "sum_auto"])
def test_running_sums_in_parallel(server: ServerProcess, protocol: str, model: str) -> None:
    rng = np.random.default_rng(7)
    sequences = {sid: rng.integers(-50, 50, size=8).astype(np.float32).tolist() for sid in range(1, 9)}
    with ThreadPoolExecutor(8) as pool:
        futures = {sid: pool.submit(run_sequence, server, protocol, model, sid, values)
                   for sid, values in sequences.items()}
        for sid, values in sequences.items():
            assert futures[sid].result(timeout=300) == np.cumsum(values).tolist()


def test_auto_complete_leaves_the_sequence_tensors_out(server: ServerProcess) -> None:
    config = httpx.get(f"http://{server.http_url}/v2/models/sum_auto/config", timeout=30).json()
    assert [t["name"] for t in config["input"]] == ["in0"]
    assert [t["name"] for t in config["output"]] == ["out0"]


@pytest.mark.parametrize(("model", "words"), [
    ("no_such_control", "sequence_batching: control input 'START' is not an input of the model; it has"),
    ("wrong_type", "sequence_batching: control input 'in1' is INT32, but the model's input is FP32"),
    ("no_such_state", "sequence_batching: state input 'STATE' is not an input of the model; it has"),
])
def test_sequence_tensors_the_model_does_not_have(server: ServerProcess, model: str, words: str) -> None:
    index = {row["name"]: row for row in httpx.post(f"http://{server.http_url}/v2/repository/index", json={},
                                                    timeout=30).json()}
    assert index[model]["state"] == "UNAVAILABLE"
    assert words in index[model]["reason"], index[model]["reason"]
