"""gRPC and memory: a large message costs the server no more than grpc's own receive path takes (3x the message: a
bare grpc.aio server whose handler does nothing peaks at 3.0x, as grpc's Python binding holds its buffer, a bytearray
it grows and the bytes it hands over at once), and a failed call gives everything back at once, without waiting for
the cyclic garbage collector (an error raised as its own cause, and context.abort inside an except block, made
reference cycles that pinned the payload: 2 GiB messages left 7.9 GB of RSS); ModelStreamInfer holds a bounded
number of requests however fast a client sends."""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
from pathlib import Path

import grpc
import numpy as np
import pytest
from serverproc import AFFINE_CONFIG, ServerProcess, make_repository

from server.errors import InvalidArgumentError
from server.protocol.grpc import pb2, pb2_grpc
from server.protocol.grpc.servicer import StreamLimits, add_to_server

pytestmark = pytest.mark.slow

MESSAGE_MIB = 256  # the machine is shared: large enough to stand out of the noise, small enough to be polite
OPTIONS = [("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    repo = make_repository(tmp_path_factory.mktemp("grpcmem"), {"affine": AFFINE_CONFIG})
    server = ServerProcess(repo)
    yield server
    assert server.stop() == 0, server.log_text


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    """Every execution takes 0.1 s longer (tests/server/slow_ops.py): a client easily sends faster than that."""
    repo = make_repository(tmp_path_factory.mktemp("grpcslow"), {"affine": AFFINE_CONFIG})
    server = ServerProcess(repo, "--grpc-stream-max-inflight", "16",
                           env={"NNSERVE_PLUGINS": "slow_ops", "PYTHONPATH": str(Path(__file__).resolve().parent)})
    yield server
    assert server.stop() == 0, server.log_text


def big_request(mib: int) -> pb2.ModelInferRequest:
    """A raw FP32 input of `mib` MiB whose batch (its first dim) is over the model's max_batch_size: decoded in
    full, then refused by validation."""
    rows = mib * 2**20 // 16
    req = pb2.ModelInferRequest(model_name="affine", id="big")
    req.inputs.add(name="in0", datatype="FP32", shape=[rows, 4])
    req.raw_input_contents.append(np.ones(rows * 4, np.float32).tobytes())
    return req


def settle(server: ServerProcess, target: float, seconds: float = 20) -> float:
    """RSS once it is at most `target` MiB, or after `seconds`."""
    deadline = time.monotonic() + seconds
    while (rss := server.memory_mib()) > target and time.monotonic() < deadline:
        time.sleep(0.2)
    return rss


def test_a_large_failed_message_costs_at_most_twice_its_size_and_is_given_back(srv: ServerProcess) -> None:
    with grpc.insecure_channel(srv.grpc_url, options=OPTIONS) as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        base = srv.memory_mib()
        peak_before = srv.memory_mib("VmHWM")
        req = big_request(MESSAGE_MIB)
        for _ in range(3):  # three in a row: a leak or a pinned payload would add up
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(req, timeout=120)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "batch-size" in info.value.details()
        del req
        peak = srv.memory_mib("VmHWM")
        after = settle(srv, base + 48)
    growth = peak - base
    assert peak <= max(peak_before, base + 3.3 * MESSAGE_MIB), (base, peak_before, peak)  # before: 5.7x
    assert after <= base + 48, f"RSS {after:.0f} MiB after the calls, {base:.0f} before (peak +{growth:.0f})"
    assert srv.proc.poll() is None


def test_stream_without_reading_answers_holds_bounded_memory(slow: ServerProcess) -> None:
    """2000 requests of 256 KiB (500 MiB) sent on one stream as fast as grpc lets the client to a model that takes
    0.1 s per batch, the answers not read for a while: the server reads at most --grpc-stream-max-inflight (16)
    ahead, so its memory stays bounded (unbounded, it read them all at once: +1 GiB); then every request is
    answered, and a unary call on another channel is served meanwhile."""
    srv = slow
    pad = "p" * (256 * 1024)
    x = np.array([[1, 2, 3, 4]], np.float32).tobytes()

    def requests():
        for i in range(2000):
            req = pb2.ModelInferRequest(model_name="affine", id=str(i))
            req.parameters["pad"].string_param = pad
            req.inputs.add(name="in0", datatype="FP32", shape=[1, 4])
            req.raw_input_contents.append(x)
            yield req

    base = srv.memory_mib()
    with grpc.insecure_channel(srv.grpc_url) as channel, grpc.insecure_channel(srv.grpc_url) as other:
        answers = pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(requests(), timeout=600)
        time.sleep(5)  # the client reads nothing meanwhile
        held = srv.memory_mib("VmHWM") - base
        unary = pb2_grpc.GRPCInferenceServiceStub(other).ModelInfer(pb2.ModelInferRequest(
            model_name="affine", inputs=[{"name": "in0", "datatype": "FP32", "shape": [1, 4]}],
            raw_input_contents=[x]), timeout=30)
        assert len(unary.raw_output_contents) == 2
        ids = []
        for a in answers:
            assert not a.error_message, a.error_message
            ids.append(int(a.infer_response.id))
        peak = srv.memory_mib("VmHWM") - base
    assert sorted(ids) == list(range(2000))
    assert held < 200 and peak < 200, (held, peak)  # unbounded, 2000 requests held 500 MiB and more


class FailingPlane:
    """A data plane that refuses every inference after holding its request, as validation does."""

    async def infer(self, req, endpoint=""):  # noqa: ANN001, ANN201
        raise InvalidArgumentError(f"refused {req.inputs[0].data.nbytes} bytes")


async def _failed_call_leaves_nothing(size: int) -> tuple[int, int]:
    server = grpc.aio.server(options=OPTIONS)
    add_to_server(server, FailingPlane(), StreamLimits())
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS) as channel:
            stub = pb2_grpc.GRPCInferenceServiceStub(channel)
            req = pb2.ModelInferRequest(model_name="m")
            req.inputs.add(name="in0", datatype="UINT8", shape=[size])
            req.raw_input_contents.append(b"\1" * size)
            data = req.SerializeToString()
            del req
            call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            await asyncio.sleep(0.1)
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(3):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call(data, timeout=30)
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            await asyncio.sleep(0.2)
            after = tracemalloc.get_traced_memory()[0]
            del stub
    finally:
        await server.stop(None)
    return before, after


def test_failed_call_leaves_no_cycle_holding_its_payload() -> None:
    """Deterministic, in-process: with the cyclic GC off, three failed 32 MiB calls leave nothing behind (a cycle
    through the traceback would pin each payload until a collection)."""
    size = 32 * 2**20
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        before, after = asyncio.run(_failed_call_leaves_nothing(size))
    finally:
        tracemalloc.stop()
        gc.enable()
    assert after - before < size // 2, (before, after)



@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    """A server of its own: its peak RSS (VmHWM) is not raised by the large messages of the tests above."""
    server = ServerProcess(make_repository(tmp_path_factory.mktemp("grpcfields"), {"affine": AFFINE_CONFIG}))
    yield server
    assert server.stop() == 0, server.log_text


@pytest.mark.parametrize("fill", ["raw_input_contents", "outputs"])
def test_a_message_of_millions_of_tiny_fields_is_refused_at_once(fresh: ServerProcess, fill: str) -> None:
    """Millions of empty raw_input_contents entries (2 bytes each on the wire) or of outputs: every field was scanned
    on the event loop and became a Python object (a view, a tensor); 40 MiB of empty entries held the server for
    over two minutes and took 7.6 GB, 24 MiB of outputs 1.1 GB and 13 s. Past grpc_wire.MAX_FIELDS the message is
    refused with INVALID_ARGUMENT, costing little, and another client is served at once meanwhile."""
    req = pb2.ModelInferRequest(model_name="affine")
    req.inputs.add(name="in0", datatype="FP32", shape=[1, 4])
    if fill == "outputs":
        for _ in range(2_000_000):
            req.outputs.add(name="o")
    else:
        req.raw_input_contents.extend([b""] * 4_000_000)
    x = np.array([[1, 2, 3, 4]], np.float32).tobytes()
    ok = pb2.ModelInferRequest(model_name="affine", inputs=[{"name": "in0", "datatype": "FP32", "shape": [1, 4]}],
                               raw_input_contents=[x])
    srv = fresh
    base = srv.memory_mib("VmHWM")
    with grpc.insecure_channel(srv.grpc_url, options=OPTIONS) as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(req, timeout=120)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
        assert "more than 65536 top-level fields" in info.value.details()
        growth = srv.memory_mib("VmHWM") - base
        assert stub.ModelInfer(ok, timeout=30).outputs[0].name == "out0"
    message_mib = req.ByteSize() / 2**20
    assert growth <= 4 * message_mib + 48, (growth, message_mib)  # before: 1.1 GB for outputs, 7.6 GB for raw
    assert srv.proc.poll() is None
