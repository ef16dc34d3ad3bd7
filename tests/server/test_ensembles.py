"""Ensembles (Triton's ensemble_scheduling) against a real server: a Python-backend step and a TNN step as one
request over HTTP and gRPC, steps running as soon as their inputs exist, each composing model counting its own
statistics, a step's error as the ensemble's, the composing models loaded with the ensemble, and every
inconsistency refused at load with a message naming it (Triton's words where it has them)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from pymodels import FAULTY_CONFIG, FAULTY_SOURCE, copy_models, ensemble, python_model
from serverproc import ServerProcess
from tritonclient.utils import InferenceServerException

from server.ensemble.graph import Step, order_steps
from server.errors import ModelLoadError

CLIENTS = {"http": httpclient, "grpc": grpcclient}

PARSE_CONFIG = """
max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 16 ] } ]
output [ { name: "VALUES" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""
PARSE_SOURCE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("VALUES", np.vectorize(int, otypes=[np.int32])(
            pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy()))]) for r in requests]
"""

# Two texts parsed by two steps that can run at once, both feeding "simple" (a TNN model).
TEXT_SUM = """
max_batch_size: 8
input [ { name: "A" data_type: TYPE_STRING dims: [ 16 ] }, { name: "B" data_type: TYPE_STRING dims: [ 16 ] } ]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "DIFF" data_type: TYPE_INT32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "parse_ints" model_version: -1 input_map { key: "TEXT" value: "A" }
    output_map { key: "VALUES" value: "a" } },
  { model_name: "parse_ints" model_version: 1 input_map { key: "TEXT" value: "B" }
    output_map { key: "VALUES" value: "b" } },
  { model_name: "simple" model_version: -1 input_map [ { key: "INPUT0" value: "a" }, { key: "INPUT1" value: "b" } ]
    output_map [ { key: "OUTPUT0" value: "SUM" }, { key: "OUTPUT1" value: "DIFF" } ] }
] }
"""
# A Python step that fails for some inputs (tests/server/pymodels.py FAULTY_SOURCE): its error is the ensemble's.
THROUGH_FAULTY = """
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "faulty" input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "Y" } }
] }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = copy_models(tmp_path_factory.mktemp("ensembles"), "simple")
    python_model(root, "parse_ints", PARSE_CONFIG, PARSE_SOURCE)
    python_model(root, "faulty", FAULTY_CONFIG, FAULTY_SOURCE)
    ensemble(root, "text_sum", TEXT_SUM)
    ensemble(root, "through_faulty", THROUGH_FAULTY)
    ensemble(root, "bad", "")  # a directory for the load API's configs (explicit mode)
    srv = ServerProcess(root, "--model-control-mode", "explicit", "--load-model", "text_sum",
                        "--load-model", "through_faulty")
    yield srv
    assert srv.stop() == 0, srv.log_text


def texts(values: np.ndarray) -> np.ndarray:
    return np.vectorize(lambda v: str(v).encode(), otypes=[object])(values)


def text_sum(srv: ServerProcess, protocol: str, a: np.ndarray, b: np.ndarray):  # noqa: ANN201
    mod = CLIENTS[protocol]
    inputs = [mod.InferInput("A", list(a.shape), "BYTES"), mod.InferInput("B", list(b.shape), "BYTES")]
    inputs[0].set_data_from_numpy(texts(a))
    inputs[1].set_data_from_numpy(texts(b))
    url = srv.http_url if protocol == "http" else srv.grpc_url
    return mod.InferenceServerClient(url).infer("text_sum", inputs)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_python_step_and_a_tnn_step_as_one_request(server, protocol):
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 5, np.int32)
    result = text_sum(server, protocol, a, b)
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
    np.testing.assert_array_equal(result.as_numpy("DIFF"), a - b)


def test_the_composing_models_were_loaded_with_the_ensemble(server):
    c = httpclient.InferenceServerClient(server.http_url)
    ready = {r["name"] for r in c.get_model_repository_index() if r.get("state") == "READY"}
    assert {"text_sum", "through_faulty", "parse_ints", "simple", "faulty"} <= ready
    meta = c.get_model_metadata("text_sum")
    assert meta["platform"] == "ensemble"
    assert meta["inputs"] == [{"name": "A", "datatype": "BYTES", "shape": [-1, 16]},
                              {"name": "B", "datatype": "BYTES", "shape": [-1, 16]}]


def test_statistics_per_composing_model(server):
    c = httpclient.InferenceServerClient(server.http_url)

    def counts() -> dict[str, tuple[int, int]]:
        out = {}
        for name in ("text_sum", "parse_ints", "simple"):
            stats = c.get_inference_statistics(name)["model_stats"][0]
            out[name] = (stats["inference_stats"]["success"]["count"], stats["execution_count"])
        return out

    before = counts()
    text_sum(server, "http", np.zeros((1, 16), np.int32), np.ones((1, 16), np.int32))
    after = counts()
    assert after["text_sum"][0] == before["text_sum"][0] + 1
    assert after["parse_ints"][0] == before["parse_ints"][0] + 2  # two steps run the same model
    assert after["simple"][0] == before["simple"][0] + 1
    stats = c.get_inference_statistics("text_sum")["model_stats"][0]["inference_stats"]
    assert stats["compute_infer"]["count"] == stats["success"]["count"] and stats["compute_infer"]["ns"] > 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_step_error_is_the_ensemble_error(server, protocol):
    mod = CLIENTS[protocol]
    url = server.http_url if protocol == "http" else server.grpc_url
    x = mod.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([1], np.int32))
    with pytest.raises(InferenceServerException) as info:
        mod.InferenceServerClient(url).infer("through_faulty", [x])
    assert "value 1 is refused" in info.value.message()
    x.set_data_from_numpy(np.array([40], np.int32))
    assert int(mod.InferenceServerClient(url).infer("through_faulty", [x]).as_numpy("Y")[0]) == 41


def _config(inputs: list[tuple[str, str, list[int]]], outputs: list[tuple[str, str, list[int]]],
            steps: list[tuple[str, dict[str, str], dict[str, str]]], max_batch_size: int = 8) -> str:
    def tensors(items: list[tuple[str, str, list[int]]]) -> list[dict]:
        return [{"name": n, "data_type": t, "dims": d} for n, t, d in items]

    return json.dumps({"name": "bad", "platform": "ensemble", "max_batch_size": max_batch_size,
                       "input": tensors(inputs), "output": tensors(outputs),
                       "ensemble_scheduling": {"step": [{"model_name": m, "model_version": -1, "input_map": i,
                                                         "output_map": o} for m, i, o in steps]}})


I32 = "TYPE_INT32"
SIMPLE_IO = {"INPUT0": "A", "INPUT1": "B"}
AB = [("A", I32, [16]), ("B", I32, [16])]
INVALID = [
    (_config(AB, [("S", I32, [16])], [("nope", SIMPLE_IO, {"OUTPUT0": "S"})]),
     "ensemble 'bad' depends on 'nope', which is not in the model repository"),
    (_config(AB[:1], [("S", I32, [16])], [("simple", {"INPUT0": "A"}, {"OUTPUT0": "S"})]),
     "in ensemble 'bad', input INPUT1 in model simple is not mapped to any ensemble tensors"),
    (_config(AB, [("S", I32, [16])], [("simple", {**SIMPLE_IO, "INPUT9": "A"}, {"OUTPUT0": "S"})]),
     "in ensemble 'bad', ensemble tensor A is mapping to non-existing input INPUT9 in model simple"),
    (_config(AB, [("S", I32, [16])], [("simple", SIMPLE_IO, {"OUTPUT7": "S"})]),
     "in ensemble 'bad', ensemble tensor S is mapped from non-existing output OUTPUT7 in model simple"),
    (_config([("A", "TYPE_FP32", [16]), AB[1]], [("S", I32, [16])], [("simple", SIMPLE_IO, {"OUTPUT0": "S"})]),
     "in ensemble 'bad', ensemble tensor A: inconsistent data type: FP32 is inferred from ensemble 'bad' while "
     "INT32 is inferred from model 'simple'"),
    (_config([("A", I32, [8]), AB[1]], [("S", I32, [16])], [("simple", SIMPLE_IO, {"OUTPUT0": "S"})]),
     "in ensemble 'bad', ensemble tensor A: inconsistent shape: [-1, 8] is inferred from ensemble 'bad' while "
     "[-1, 16] is inferred from model 'simple'"),
    (_config(AB, [("S", I32, [16])], [("simple", {"INPUT0": "x", "INPUT1": "B"}, {"OUTPUT0": "y"}),
                                      ("simple", {"INPUT0": "y", "INPUT1": "A"}, {"OUTPUT0": "x", "OUTPUT1": "S"})]),
     "in ensemble 'bad', steps feed each other in a cycle: step 0 (model 'simple') -> step 1 (model 'simple') -> "
     "step 0 (model 'simple')"),
    (_config(AB, [("S", I32, [16])], [("simple", SIMPLE_IO, {"OUTPUT0": "S", "OUTPUT1": "extra"})]),
     "ensemble tensor 'extra' is unused in ensemble 'bad'"),
    (_config(AB, [("S", I32, [16]), ("T", I32, [16])], [("simple", SIMPLE_IO, {"OUTPUT0": "S"})]),
     "output 'T' for ensemble 'bad' is not written"),
    (_config([*AB, ("C", I32, [16])], [("S", I32, [16])], [("simple", SIMPLE_IO, {"OUTPUT0": "S"})]),
     "ensemble input 'C' for ensemble 'bad' is not used"),
    (_config(AB, [("S", I32, [16])], [("simple", SIMPLE_IO, {"OUTPUT0": "S"})], max_batch_size=16),
     "ensemble 'bad' allows maximum batch size 16, but it contains model simple which only allows maximum batch "
     "size to be 8"),
    (_config(AB, [("S", I32, [16])], [("simple", SIMPLE_IO, {"OUTPUT0": "S"})] * 2),
     "ensemble tensor 'S' can appear in an output map only once for ensemble 'bad' step 1"),
]


@pytest.mark.parametrize("config, words", INVALID)
def test_an_inconsistent_ensemble_is_refused_at_load(server, config, words):
    c = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as info:
        c.load_model("bad", config=config)
    assert words in info.value.message(), info.value.message()
    assert info.value.status() == "400"


def test_ensembles_that_depend_on_each_other_are_refused(tmp_path):
    copy_models(tmp_path, "simple")
    step = '{{ model_name: "{}" input_map {{ key: "A" value: "A" }} output_map {{ key: "S" value: "S" }} }}'
    for name, other in (("e1", "e2"), ("e2", "e1")):
        ensemble(tmp_path, name, 'max_batch_size: 8\ninput [ { name: "A" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
                                 'output [ { name: "S" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
                                 f"ensemble_scheduling {{ step [ {step.format(other)} ] }}\n")
    srv = ServerProcess(tmp_path, "--exit-on-error", "false", "--strict-readiness", "false")
    try:
        index = {r["name"]: r for r in httpclient.InferenceServerClient(srv.http_url).get_model_repository_index()}
        assert "circular dependency between ensembles: e1 -> e2 -> e1" in index["e1"]["reason"]
        assert "circular dependency between ensembles: e2 -> e1 -> e2" in index["e2"]["reason"]
        assert index["simple"]["state"] == "READY"
    finally:
        assert srv.stop() == 0, srv.log_text


def _step(index: int, ins: dict[str, str], outs: dict[str, str]) -> Step:
    return Step(index, f"m{index}", "", ins, outs)


def test_steps_are_ordered_by_what_they_read():
    steps = [_step(0, {"x": "b"}, {"y": "OUT"}), _step(1, {"x": "IN"}, {"y": "a"}), _step(2, {"x": "a"}, {"y": "b"})]
    assert [s.index for s in order_steps("e", ["IN"], ["OUT"], steps)] == [1, 2, 0]


def test_a_step_reading_what_nothing_writes():
    with pytest.raises(ModelLoadError) as info:
        order_steps("e", ["IN"], ["OUT"], [_step(0, {"x": "IN", "z": "ghost"}, {"y": "OUT"})])
    assert info.value.message == ("in ensemble 'e', step 0 (model 'm0') reads ensemble tensor 'ghost', which is "
                                  "neither an ensemble input nor written by any step")
