"""The statistics extension and the Prometheus metrics follow Triton's definitions (docs/metrics.md): a request's
time in the server (success / fail) runs from its arrival in the front end to its outputs being ready, the queue
from its scheduling to its execution's start, and compute_input/infer/output are the execution's phases, each
request of a batch counting its whole execution. Checked on the real server with tritonclient, by order relations
that hold however loaded the machine is: a gated model holds its one instance while requests queue behind it
(the test waits for the pending-request gauge, no sleeping), so queue time is certain."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from pymodels import ensemble, python_model
from serverproc import AFFINE_CONFIG, ServerProcess, make_repository

# OUT = IN; every execution says it started (the file <gate>/held) and waits until the file <gate>/open exists.
GATED_SOURCE = """
import os
import time

import triton_python_backend_utils as pb_utils

GATE = {gate!r}


class TritonPythonModel:
    def execute(self, requests):
        open(GATE + ".held", "w").close()
        for _ in range(6000):
            if os.path.exists(GATE):
                break
            time.sleep(0.01)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                            .as_numpy())]) for r in requests]
"""
DIRECT_CONFIG = """
max_batch_size: 0
instance_group [ { count: 1 kind: KIND_CPU } ]
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
BATCHED_CONFIG = """
max_batch_size: 8
dynamic_batching { }
instance_group [ { count: 1 kind: KIND_CPU } ]
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
# Two steps, one after the other, through gated_direct.
TWICE_CONFIG = """
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "gated_direct" input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "mid" } },
  { model_name: "gated_direct" input_map { key: "IN" value: "mid" } output_map { key: "OUT" value: "OUT" } }
] }
"""
CLIENTS = {"http": httpclient, "grpc": grpcclient}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = make_repository(tmp_path_factory.mktemp("statsrepo"), {"affine": AFFINE_CONFIG})
    gates = tmp_path_factory.mktemp("gates")
    for name, config in (("gated_direct", DIRECT_CONFIG), ("gated_batched", BATCHED_CONFIG)):
        (gates / name).mkdir()
        python_model(root, name, config, GATED_SOURCE.format(gate=str(gates / name / "open")))
    ensemble(root, "twice_gated", TWICE_CONFIG)
    server = ServerProcess(root)
    server.gates = gates
    yield server
    for name in ("gated_direct", "gated_batched"):
        (gates / name / "open").touch()  # never leave an execution held
    assert server.stop() == 0, server.log_text


def client(srv: ServerProcess, protocol: str):  # noqa: ANN201
    module = CLIENTS[protocol]
    return module, module.InferenceServerClient(srv.http_url if protocol == "http" else srv.grpc_url)


def stats(srv: ServerProcess, model: str) -> dict:
    body = httpx.get(f"http://{srv.http_url}/v2/models/{model}/stats", timeout=30).json()
    (entry,) = body["model_stats"]
    return entry


def grpc_stats(srv: ServerProcess, model: str) -> dict:
    _, c = client(srv, "grpc")
    (entry,) = c.get_inference_statistics(model, as_json=True)["model_stats"]
    return entry


def ns(entry: dict, phase: str) -> int:
    return int(entry["inference_stats"][phase].get("ns", 0))


def count(entry: dict, phase: str) -> int:
    return int(entry["inference_stats"][phase].get("count", 0))


def metric(srv: ServerProcess, name: str, model: str) -> float:
    text = httpx.get(srv.metrics_url, timeout=30).text
    pattern = rf'^{name}{{[^}}]*model="{model}"[^}}]*}} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, text, re.M))


def wait_for(predicate, what: str) -> None:  # noqa: ANN001
    for _ in range(12000):
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"never: {what}")


def infer(srv: ServerProcess, protocol: str, model: str, value: int) -> int:
    """One request; the client's wall time around it, in ns."""
    mod, c = client(srv, protocol)
    inp = mod.InferInput("IN", [1, 1] if model == "gated_batched" else [1], "INT32")
    inp.set_data_from_numpy(np.full(inp.shape(), value, np.int32))
    t0 = time.perf_counter_ns()
    result = c.infer(model, [inp])
    wall = time.perf_counter_ns() - t0
    assert result.as_numpy("OUT").ravel().tolist() == [value]
    return wall


def held_round(srv: ServerProcess, protocol: str, model: str, n: int) -> list[int]:
    """n concurrent requests to a gated model: the first holds the instance until the other n-1 are queued (the
    pending-request gauge says so), then the gate opens. The clients' wall times."""
    gate, held = srv.gates / model / "open", srv.gates / model / "open.held"
    gate.unlink(missing_ok=True)
    held.unlink(missing_ok=True)
    walls: list[int] = []
    errors: list[BaseException] = []

    def one(value: int) -> None:
        try:
            walls.append(infer(srv, protocol, model, value))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    threads[0].start()
    wait_for(held.exists, "the first request executing")
    for t in threads[1:]:
        t.start()
    wait_for(lambda: metric(srv, "nv_inference_pending_request_count", model) == n - 1, "the others queued")
    gate.touch()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return walls


def check_consistent(entry: dict) -> None:
    """Triton's relations: each success holds its queue and compute phases; the counts agree."""
    phases = ("queue", "compute_input", "compute_infer", "compute_output")
    assert all(count(entry, p) == count(entry, "success") for p in phases), entry
    assert ns(entry, "success") >= sum(ns(entry, p) for p in phases), entry


def check_metrics_agree(srv: ServerProcess, model: str, entry: dict) -> None:
    """The Prometheus counters are the same figures, in whole microseconds per request (Triton truncates each)."""
    n = count(entry, "success")
    assert metric(srv, "nv_inference_request_success", model) == n
    assert metric(srv, "nv_inference_count", model) == entry["inference_count"]
    assert metric(srv, "nv_inference_exec_count", model) == entry["execution_count"]
    for name, phase in (("request", "success"), ("queue", "queue"), ("compute_input", "compute_input"),
                        ("compute_infer", "compute_infer"), ("compute_output", "compute_output")):
        us = metric(srv, f"nv_inference_{name}_duration_us", model)
        assert ns(entry, phase) / 1000 - n <= us <= ns(entry, phase) / 1000, (name, us, entry)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_requests_queued_behind_a_busy_instance_count_their_queue_time(srv: ServerProcess, protocol: str) -> None:
    before = stats(srv, "gated_direct")
    walls = held_round(srv, protocol, "gated_direct", 4)
    after = stats(srv, "gated_direct")
    delta = {p: ns(after, p) - ns(before, p) for p in ("success", "queue", "compute_infer")}
    assert count(after, "success") - count(before, "success") == 4
    # three requests waited in the queue while the first one's execution was held
    assert delta["queue"] > 0
    assert sum(walls) >= delta["success"]  # the clients saw at least the server's time
    check_consistent(after)
    assert after["execution_count"] - before["execution_count"] == 4
    check_metrics_agree(srv, "gated_direct", after)
    over_grpc = grpc_stats(srv, "gated_direct")  # the same figures (as protobuf's JSON: strings, zeros left out)
    for phase in after["inference_stats"]:
        assert (count(over_grpc, phase), ns(over_grpc, phase)) == (count(after, phase), ns(after, phase))


def test_a_dynamic_batch_counts_per_batch_size_and_each_request_its_whole_execution(srv: ServerProcess) -> None:
    before = stats(srv, "gated_batched")
    held_round(srv, "grpc", "gated_batched", 4)  # one execution of 1, then one of the 3 that queued
    after = stats(srv, "gated_batched")
    assert after["inference_count"] - before["inference_count"] == 4
    assert after["execution_count"] - before["execution_count"] == 2
    sizes = {b["batch_size"]: int(b["compute_infer"]["count"]) for b in after["batch_stats"]}
    assert sizes.get(1, 0) >= 1 and sizes.get(3, 0) >= 1, after["batch_stats"]
    # each request of an execution counts the execution's whole phases, as Triton counts them (one row each here)
    for phase in ("compute_input", "compute_infer", "compute_output"):
        assert ns(after, phase) == sum(b["batch_size"] * int(b[phase].get("ns", 0)) for b in after["batch_stats"])
    check_consistent(after)
    check_metrics_agree(srv, "gated_batched", after)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_each_request_time_in_the_server_is_within_what_its_client_saw(srv: ServerProcess, protocol: str) -> None:
    for model in ("affine", "gated_direct"):
        (srv.gates / "gated_direct" / "open").touch()
        for _ in range(3):
            before = stats(srv, model)
            mod, c = client(srv, protocol)
            if model == "affine":
                inp = mod.InferInput("in0", [1, 4], "FP32")
                inp.set_data_from_numpy(np.ones((1, 4), np.float32))
                t0 = time.perf_counter_ns()
                c.infer(model, [inp])
                wall = time.perf_counter_ns() - t0
            else:
                wall = infer(srv, protocol, model, 7)
            after = stats(srv, model)
            assert count(after, "success") - count(before, "success") == 1
            assert 0 < ns(after, "success") - ns(before, "success") <= wall
            check_consistent(after)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_failed_request_counts_its_duration_in_fail_and_not_in_the_request_duration(srv: ServerProcess,
                                                                                      protocol: str) -> None:
    before = stats(srv, "affine")
    us_before = metric(srv, "nv_inference_request_duration_us", "affine")
    failures = metric(srv, "nv_inference_request_failure", "affine")
    mod, c = client(srv, protocol)
    inp = mod.InferInput("in0", [1, 4], "INT32")  # the model wants FP32
    inp.set_data_from_numpy(np.ones((1, 4), np.int32))
    t0 = time.perf_counter_ns()
    with pytest.raises(Exception, match="data-type"):
        c.infer("affine", [inp])
    wall = time.perf_counter_ns() - t0
    after = stats(srv, "affine")
    assert count(after, "fail") - count(before, "fail") == 1
    assert 0 < ns(after, "fail") - ns(before, "fail") <= wall
    assert metric(srv, "nv_inference_request_failure", "affine") == failures + 1
    assert metric(srv, "nv_inference_request_duration_us", "affine") == us_before  # Triton: successes only


def test_an_ensemble_counts_its_steps_compute_and_spans_their_requests(srv: ServerProcess) -> None:
    (srv.gates / "gated_direct" / "open").touch()
    before_ens, before_step = stats(srv, "twice_gated"), stats(srv, "gated_direct")
    wall = infer(srv, "grpc", "twice_gated", 9)
    ens, step = stats(srv, "twice_gated"), stats(srv, "gated_direct")
    assert count(ens, "success") - count(before_ens, "success") == 1
    assert ens["execution_count"] - before_ens["execution_count"] == 1
    assert count(step, "success") - count(before_step, "success") == 2
    # the ensemble's compute phases are its steps' (Triton adds up the composing models' phases), its queue nil
    for phase in ("compute_input", "compute_infer", "compute_output"):
        assert ns(ens, phase) - ns(before_ens, phase) == ns(step, phase) - ns(before_step, phase)
    # its steps ran one after the other inside its own time, which its client saw whole
    assert wall >= ns(ens, "success") - ns(before_ens, "success") >= ns(step, "success") - ns(before_step, "success")
    check_consistent(ens)
    check_metrics_agree(srv, "twice_gated", ens)
