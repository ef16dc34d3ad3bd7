"""Triton's sequence batcher against a real server with tritonclient, over HTTP, gRPC and gRPC streams: what Triton's
sequence client examples do (simple_sequence with integer and string ids), control tensor values and dtypes,
routing of a sequence to one instance with the direct and oldest strategies, batching of requests from different
sequences, the backlog, implicit state, the idle timeout, and Triton's errors. Requests are held in the model by
gate files (seqmodels.CONTROLS_SOURCE) and progress is read from the server's metrics: nothing depends on timing."""

from __future__ import annotations

import queue
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from seqmodels import sequence_models
from serverproc import ServerProcess
from tritonclient.utils import InferenceServerException

CLIENTS = {"http": httpclient, "grpc": grpcclient}
PROTOCOLS = ("http", "grpc")
VALUES = [11, 7, 5, 3, 2, 0, 1]  # Triton's sequence examples send [first] + VALUES (or their negatives)


@pytest.fixture(scope="module")
def gate_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gates")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gate_dir: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(sequence_models(tmp_path_factory.mktemp("seqrepo"), gate_dir))
    yield srv
    assert srv.stop() == 0, srv.log_text


def client(srv: ServerProcess, protocol: str) -> Any:
    return CLIENTS[protocol].InferenceServerClient(srv.http_url if protocol == "http" else srv.grpc_url)


def int_input(protocol: str, value: int, shape: tuple[int, ...] = (1, 1)) -> Any:
    inp = CLIENTS[protocol].InferInput("INPUT", list(shape), "INT32")
    inp.set_data_from_numpy(np.full(shape, value, np.int32))
    return inp


def infer(srv: ServerProcess, protocol: str, model: str, value: int, sequence_id: int | str = 0,
          start: bool = False, end: bool = False) -> Any:
    return client(srv, protocol).infer(model, [int_input(protocol, value)], sequence_id=sequence_id,
                                       sequence_start=start, sequence_end=end)


def out(result: Any, name: str = "OUTPUT") -> Any:
    return result.as_numpy(name)[0][0]


def send_sequence(srv: ServerProcess, protocol: str, model: str, sequence_id: int | str, values: list[int]) -> list:
    c = client(srv, protocol)
    results = []
    for i, value in enumerate(values):
        result = c.infer(model, [int_input(protocol, value)], sequence_id=sequence_id, sequence_start=i == 0,
                         sequence_end=i == len(values) - 1)
        results.append(int(out(result)))
    return results


def metric(srv: ServerProcess, line_start: str) -> float:
    for line in httpx.get(srv.metrics_url, timeout=30).text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for(predicate: Callable[[], bool], what: str, srv: ServerProcess, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert srv.proc.poll() is None, f"the server exited while waiting for {what}:\n{srv.log_text}"
        assert time.monotonic() < deadline, f"never saw {what}:\n{srv.log_text}"
        time.sleep(0.05)


def wait_pending(srv: ServerProcess, model: str, count: int) -> None:
    line = f'nv_inference_pending_request_count{{model="{model}",version="1"}}'
    wait_for(lambda: metric(srv, line) == count, f"{count} queued requests of {model}", srv)


class Gate:
    """Requests with INPUT -n wait in the model until open(n) creates the gate file n."""

    def __init__(self, gate_dir: Path, first: int):
        self.gate_dir = gate_dir
        self.next = first

    def new(self) -> int:
        self.next += 1
        return -self.next

    def open(self, value: int) -> None:
        (self.gate_dir / str(-value)).touch()


# ---- Triton's client examples ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_simple_sequence_sync_example(server: ServerProcess, protocol: str) -> None:
    """simple_{http,grpc}_sequence_sync_infer_client: two integer ids and a string id, one after the other."""
    string_id = str(uuid.uuid4())
    seq0 = send_sequence(server, protocol, "simple_sequence", 1000, [0, *VALUES])
    seq1 = send_sequence(server, protocol, "simple_sequence", 1001, [100] + [-v for v in VALUES])
    seq2 = send_sequence(server, protocol, "simple_sequence", string_id, [20] + [-v for v in VALUES])
    assert seq0 == [1, *VALUES]
    assert seq1 == [101] + [-v for v in VALUES]
    assert seq2 == [21] + [-v for v in VALUES]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_dyna_sequence_examples(server: ServerProcess, protocol: str) -> None:
    """The same examples with -d: simple_dyna_sequence (oldest, uint64 CORRID: the id is added on the last request)
    and simple_string_dyna_sequence (a string CORRID, an accumulator on implicit state)."""
    seq0 = send_sequence(server, protocol, "simple_dyna_sequence", 1000, [0, *VALUES])
    seq1 = send_sequence(server, protocol, "simple_dyna_sequence", 1001, [100] + [-v for v in VALUES])
    seq2 = send_sequence(server, protocol, "simple_string_dyna_sequence", "1002", [20] + [-v for v in VALUES])
    assert seq0 == [1, *VALUES[:-1], VALUES[-1] + 1000]
    assert seq1 == [101] + [-v for v in VALUES[:-1]] + [-VALUES[-1] + 1001]
    assert seq2 == [*np.cumsum([20] + [-v for v in VALUES])[:-1].tolist(), 20 - sum(VALUES) + 1002]


def test_simple_sequence_stream_example(server: ServerProcess) -> None:
    """simple_grpc_sequence_stream_infer_client: three sequences sent on one stream without waiting for answers; each
    sequence's responses come in its order."""
    answers: queue.Queue[Any] = queue.Queue()
    string_id = str(uuid.uuid4())
    sequences = {"1000": [0, *VALUES], "1001": [100] + [-v for v in VALUES], string_id: [20] + [-v for v in VALUES]}
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        c.start_stream(callback=lambda result, error: answers.put(error or result))
        for key, values in sequences.items():
            sequence_id: int | str = int(key) if key.isdigit() else key
            for i, value in enumerate(values):
                c.async_stream_infer("simple_sequence", [int_input("grpc", value)], request_id=f"{key}_{i}",
                                     sequence_id=sequence_id, sequence_start=i == 0,
                                     sequence_end=i == len(values) - 1)
        got: dict[str, list[tuple[int, int]]] = {k: [] for k in sequences}
        for _ in range(sum(len(v) for v in sequences.values())):
            item = answers.get(timeout=120)
            assert not isinstance(item, InferenceServerException), item
            key, index = item.get_response().id.rsplit("_", 1)
            got[key].append((int(index), int(out(item))))
        c.stop_stream()
    for key, values in sequences.items():
        assert [i for i, _ in got[key]] == list(range(len(values)))  # in order
        assert [v for _, v in got[key]] == [values[0] + 1, *values[1:]]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_interleaved_sequences(server: ServerProcess, protocol: str) -> None:
    """Requests of two sequences alternate; each sequence's implicit state is its own."""
    c = client(server, protocol)
    totals = {31: 0, 32: 0}
    for step in range(5):
        for sid in totals:
            result = c.infer("seq_state", [int_input(protocol, sid + step)], sequence_id=sid,
                             sequence_start=step == 0, sequence_end=step == 4)
            totals[sid] += sid + step
            assert int(out(result)) == totals[sid]


# ---- control tensors ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_control_values_and_dtypes(server: ServerProcess, protocol: str) -> None:
    """START fp32 (0.5, 2.5), END int32 (7, 9), READY bool, CORRID uint64; pb_utils' correlation_id() and flags()."""
    sid = 2**40 + 17
    rows = [infer(server, protocol, "seq_direct", 5, sid, start=True),
            infer(server, protocol, "seq_direct", 6, sid),
            infer(server, protocol, "seq_direct", 7, sid, end=True),
            infer(server, protocol, "seq_direct", 8, sid + 1, start=True, end=True)]
    assert [out(r, "START_OUT") for r in rows] == [2.5, 0.5, 0.5, 2.5]
    assert [out(r, "END_OUT") for r in rows] == [7, 7, 9, 9]
    assert [bool(out(r, "READY_OUT")) for r in rows] == [True] * 4
    assert [int(out(r, "CORRID_OUT")) for r in rows] == [sid, sid, sid, sid + 1]
    assert [int(out(r, "FLAGS")) for r in rows] == [1, 0, 2, 3]
    assert [int(out(r)) for r in rows] == [5, 6, 7, 8]
    dtypes = [rows[0].as_numpy(n).dtype for n in ("START_OUT", "END_OUT", "READY_OUT", "CORRID_OUT")]
    assert dtypes == [np.float32, np.int32, np.bool_, np.uint64]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_string_correlation_id(server: ServerProcess, protocol: str) -> None:
    """A TYPE_STRING CORRID control carries the string id; the same digits as a number are another sequence."""
    sid = f"session-{uuid.uuid4()}"
    first = infer(server, protocol, "seq_string", 1, sid, start=True)
    assert first.as_numpy("CORRID_OUT")[0][0] == sid.encode()
    assert int(out(infer(server, protocol, "seq_string", 2, sid, end=True))) == 2
    infer(server, protocol, "seq_string", 3, "4242", start=True)
    with pytest.raises(InferenceServerException, match="sequence 4242 to model 'seq_string' must specify the START"):
        infer(server, protocol, "seq_string", 4, 4242)  # the uint64 4242 is not the string "4242"
    assert out(infer(server, protocol, "seq_string", 5, "4242", end=True), "CORRID_OUT") == b"4242"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_int32_corrid_takes_the_low_bits(server: ServerProcess, protocol: str) -> None:
    """A 32-bit CORRID control gets the id's low-order 32 bits, as Triton truncates it; a numeric string id is the
    number."""
    sid = 2**33 + 5
    assert out(infer(server, protocol, "seq_int32", 1, sid, start=True, end=True), "CORRID_OUT") == 5
    assert out(infer(server, protocol, "seq_int32", 1, "77", start=True, end=True), "CORRID_OUT") == 77
    with pytest.raises(InferenceServerException, match="correlation ID 'abc' is a string, but its CORRID control"):
        infer(server, protocol, "seq_int32", 1, "abc", start=True)


# ---- errors ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_triton_errors(server: ServerProcess, protocol: str) -> None:
    c = client(server, protocol)
    with pytest.raises(InferenceServerException) as err:
        c.infer("seq_direct", [int_input(protocol, 1)])
    assert "inference request to model 'seq_direct' must specify a non-zero or non-empty correlation ID" in str(
        err.value)
    with pytest.raises(InferenceServerException) as err:
        c.infer("seq_direct", [int_input(protocol, 1)], sequence_id=987654)
    assert ("inference request for sequence 987654 to model 'seq_direct' must specify the START flag on the first "
            "request of the sequence") in str(err.value)
    with pytest.raises(InferenceServerException, match="must specify batch-size 1 due to requirements of sequence "
                                                       "batcher"):
        c.infer("seq_direct", [int_input(protocol, 1, (2, 1))], sequence_id=5, sequence_start=True)
    # after its END, a sequence is closed: continuing it is refused as Triton does
    infer(server, protocol, "seq_direct", 1, 4455, start=True, end=True)
    with pytest.raises(InferenceServerException, match="sequence 4455 to model 'seq_direct' must specify the START"):
        infer(server, protocol, "seq_direct", 1, 4455)
    if protocol == "http":
        assert err.value.status() == "400"
    else:
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_http_parameters_of_the_wrong_type(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}
    url = f"http://{server.http_url}/v2/models/seq_direct/infer"
    for params, message in (({"sequence_id": 1, "sequence_start": "yes"}, "'sequence_start' must be a boolean"),
                            ({"sequence_id": 1.5}, "'sequence_id' must be an unsigned integer or a string"),
                            ({"sequence_id": -3, "sequence_start": True}, "unsigned 64-bit integer")):
        reply = httpx.post(url, json={**body, "parameters": params}, timeout=30)
        assert reply.status_code == 400, reply.text
        assert message in reply.json()["error"]


# ---- routing, batching, backlog -------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["seq_direct", "seq_oldest"])
def test_one_instance_per_sequence_and_batches_across_sequences(server: ServerProcess, gate_dir: Path,
                                                                model: str) -> None:
    """Five sequences over two instances: each sequence keeps its instance; while one request holds an instance,
    the requests of that instance's other sequences queue and then run as one execution."""
    base = 7000 if model == "seq_direct" else 8000
    gate = Gate(gate_dir, base)
    sids = [base + i for i in range(5)]
    pids = {sid: int(out(infer(server, "grpc", model, 1, sid, start=True), "PID")) for sid in sids}
    assert len(set(pids.values())) == 2  # spread over both instances
    busy = [sid for sid in sids if pids[sid] == pids[sids[0]]]
    assert len(busy) >= 2
    hold = gate.new()
    with ThreadPoolExecutor(len(busy)) as pool:
        held = pool.submit(infer, server, "grpc", model, hold, busy[0])
        wait_for(lambda: (gate_dir / f"{-hold}.held").exists(), "the held execution", server)
        # the others of that instance queue behind the held execution
        queued = [pool.submit(infer, server, "grpc", model, 100 + i, sid) for i, sid in enumerate(busy[1:])]
        wait_pending(server, model, len(queued))
        gate.open(hold)
        assert int(out(held.result(timeout=120))) == hold
        results = [q.result(timeout=120) for q in queued]
    assert [int(out(r)) for r in results] == [100 + i for i in range(len(queued))]
    assert {int(out(r, "BATCH")) for r in results} == {len(queued)}  # one execution for all of them
    assert {int(out(r, "PID")) for r in results} == {pids[sids[0]]}
    for sid in sids:  # every later request of a sequence runs on its instance
        assert int(out(infer(server, "http", model, 1, sid, end=True), "PID")) == pids[sid]


def test_backlog_waits_for_a_free_slot(server: ServerProcess) -> None:
    """seq_one_slot holds one sequence at a time: a second sequence waits in the backlog until the first ends."""
    infer(server, "grpc", "seq_one_slot", 1, 501, start=True)
    with ThreadPoolExecutor(1) as pool:
        second = pool.submit(infer, server, "grpc", "seq_one_slot", 2, 502, start=True, end=True)
        wait_pending(server, "seq_one_slot", 1)
        assert not second.done()
        infer(server, "grpc", "seq_one_slot", 3, 501, end=True)
        assert int(out(second.result(timeout=120))) == 2


# ---- idle sequences -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_idle_sequence_is_released(server: ServerProcess, protocol: str) -> None:
    """seq_idle releases a sequence idle for 0.3 s: after ten times that, continuing it is Triton's START error."""
    sid = 600 if protocol == "http" else 601
    infer(server, protocol, "seq_idle", 1, sid, start=True)
    time.sleep(3.0)  # only ever longer than the idle time, whatever the load
    with pytest.raises(InferenceServerException, match=f"sequence {sid} to model 'seq_idle' must specify the START"):
        infer(server, protocol, "seq_idle", 2, sid)


def test_idle_release_frees_the_slot_for_the_backlog(server: ServerProcess) -> None:
    """seq_idle has one slot: a sequence left open is released for idleness, and the waiting one then runs."""
    infer(server, "grpc", "seq_idle", 1, 610, start=True)
    assert int(out(infer(server, "grpc", "seq_idle", 2, 611, start=True, end=True))) == 2
    with pytest.raises(InferenceServerException, match="sequence 610 to model 'seq_idle' must specify the START"):
        infer(server, "grpc", "seq_idle", 3, 610)


# ---- implicit state -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("model", "initial"), [("seq_state", 0), ("seq_state_file", 100), ("seq_state_nobatch", 0)])
def test_implicit_state(server: ServerProcess, protocol: str, model: str, initial: int) -> None:
    """The model's OUTPUT_STATE comes back as its INPUT_STATE on the sequence's next request; a START resets it to
    the initial state (zeros, or initial_state/hundred); the state output is not part of the response."""
    shape = (1,) if model == "seq_state_nobatch" else (1, 1)
    c = client(server, protocol)

    def step(value: int, **flags: Any) -> Any:
        return c.infer(model, [int_input(protocol, value, shape)], sequence_id=90, **flags)

    totals = []
    for i, value in enumerate([1, 2, 3]):
        totals.append(int(step(value, sequence_start=i == 0).as_numpy("OUTPUT").flat[0]))
    assert totals == [initial + 1, initial + 3, initial + 6]
    restarted = step(10, sequence_start=True, sequence_end=True)
    assert int(restarted.as_numpy("OUTPUT").flat[0]) == initial + 10
    assert restarted.as_numpy("OUTPUT_STATE") is None


def test_sequence_statistics(server: ServerProcess) -> None:
    """Sequence requests are counted in the model's statistics as any others."""
    before = client(server, "http").get_inference_statistics("simple_sequence")["model_stats"][0]
    send_sequence(server, "http", "simple_sequence", 4444, [1, 2])
    after = client(server, "http").get_inference_statistics("simple_sequence")["model_stats"][0]
    assert after["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 2
    assert after["execution_count"] == before["execution_count"] + 2


def test_threads_each_with_a_sequence(server: ServerProcess) -> None:
    """Eight clients at once, each with its own sequence on seq_state: every total is its own."""
    def run(sid: int) -> list[int]:
        c = client(server, "http")
        got = []
        for step in range(6):
            r = c.infer("seq_state", [int_input("http", sid)], sequence_id=sid, sequence_start=step == 0,
                        sequence_end=step == 5)
            got.append(int(out(r)))
        return got

    with ThreadPoolExecutor(8) as pool:
        results = dict(zip(range(1, 9), pool.map(run, range(1, 9)), strict=True))
    for sid, got in results.items():
        assert got == [sid * (k + 1) for k in range(6)]

