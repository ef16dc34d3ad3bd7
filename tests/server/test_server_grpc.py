"""gRPC end to end: tritonclient.grpc (sync, asyncio, streaming) and a raw grpc channel with our own stubs."""

from __future__ import annotations

import asyncio
import queue

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from serverproc import affine_reference
from tritonclient.utils import InferenceServerException

from server.protocol.grpc import health_pb2, health_pb2_grpc, pb2, pb2_grpc

X = np.linspace(-2, 2, 20, dtype=np.float32).reshape(5, 4)


def infer_input(x: np.ndarray, module=grpcclient, datatype: str = "FP32", name: str = "in0"):
    inp = module.InferInput(name, list(x.shape), datatype)
    inp.set_data_from_numpy(x)
    return inp


def test_health_metadata_config(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("affine")
    assert not client.is_model_ready("affine", "2")  # Triton: a version the model lacks is not ready, no error
    meta = client.get_server_metadata()
    assert meta.name == "nnserve" and "statistics" in meta.extensions
    md = client.get_model_metadata("affine")
    assert list(md.inputs[0].shape) == [-1, 4] and md.inputs[0].datatype == "FP32"
    config = client.get_model_config("affine").config
    assert config.max_batch_size == 8 and config.dynamic_batching.max_queue_delay_microseconds == 20000
    assert config.instance_group[0].count == 2


def test_sync_infer_raw_contents(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    result = client.infer("affine", [infer_input(X)], request_id="g1")
    ref = affine_reference(X)
    assert result.get_response().id == "g1"
    for name in ("out0", "out1"):
        np.testing.assert_allclose(result.as_numpy(name), ref[name], rtol=1e-5, atol=1e-6)


def test_typed_contents_with_raw_stub(server):
    """A client that sends InferTensorContents.fp32_contents instead of raw_input_contents."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        req = pb2.ModelInferRequest(model_name="affine")
        t = req.inputs.add(name="in0", datatype="FP32", shape=[2, 4])
        t.contents.fp32_contents.extend(X[:2].reshape(-1).tolist())
        req.outputs.add(name="out0")
        resp = stub.ModelInfer(req)
        assert [o.name for o in resp.outputs] == ["out0"] and list(resp.outputs[0].shape) == [2, 3]
        got = np.frombuffer(resp.raw_output_contents[0], "<f4").reshape(2, 3)
        np.testing.assert_allclose(got, affine_reference(X[:2])["out0"], rtol=1e-5, atol=1e-6)
        assert stub.ServerLive(pb2.ServerLiveRequest()).live


@pytest.mark.parametrize("x, datatype, code, words", [
    (np.zeros((2, 5), np.float32), "FP32", "INVALID_ARGUMENT", "unexpected shape"),
    (np.zeros((2, 4), np.float64), "FP64", "INVALID_ARGUMENT", "data-type is 'FP64'"),
    (np.zeros((2, 4), np.float32), "FP32", "INVALID_ARGUMENT", "unexpected inference input"),
])
def test_infer_errors_status_codes(server, x, datatype, code, words):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    name = "bogus" if "input" in words else "in0"
    with pytest.raises(InferenceServerException) as info:
        client.infer("affine", [infer_input(x, datatype=datatype, name=name)])
    assert code in info.value.status() and words in info.value.message()


def test_unknown_model_and_version(server):
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelMetadata(pb2.ModelMetadataRequest(name="nope"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND  # Triton 2.51
        assert info.value.details() == "Request for unknown model: 'nope' is not found"
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelConfig(pb2.ModelConfigRequest(name="affine", version="9"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(pb2.ModelInferRequest(model_name="affine"))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_asyncio_client_concurrent(server):
    async def main() -> list[np.ndarray]:
        client = aioclient.InferenceServerClient(server.grpc_url)
        try:
            calls = [client.infer("affine", [infer_input(X[i:i + 1], aioclient)]) for i in range(5)]
            return [r.as_numpy("out1") for r in await asyncio.gather(*calls)]
        finally:
            await client.close()

    outs = asyncio.run(main())
    np.testing.assert_allclose(np.concatenate(outs), affine_reference(X)["out1"], rtol=1e-5, atol=1e-6)


def test_streaming_infer_and_stream_errors(server):
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for i in range(3):
            client.async_stream_infer("affine", [infer_input(X[i:i + 2])], request_id=f"s{i}")
        client.async_stream_infer("affine", [infer_input(np.zeros((1, 7), np.float32))], request_id="bad")
        got = [results.get(timeout=30) for _ in range(4)]
    finally:
        client.stop_stream()
    errors = [e for _, e in got if e is not None]
    assert len(errors) == 1 and "unexpected shape" in errors[0].message()
    by_id = {r.get_response().id: r for r, e in got if e is None}
    for i in range(3):
        np.testing.assert_allclose(by_id[f"s{i}"].as_numpy("out0"), affine_reference(X[i:i + 2])["out0"],
                                   rtol=1e-5, atol=1e-6)


def test_statistics_and_index(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.infer("affine", [infer_input(X[:3])])
    stats = client.get_inference_statistics("affine").model_stats[0]
    assert stats.name == "affine" and stats.inference_count >= 3 and stats.execution_count >= 1
    assert stats.inference_stats.compute_infer.ns > 0
    index = client.get_model_repository_index()
    assert {m.name for m in index.models} == {"affine", "affine_auto"}
    with pytest.raises(InferenceServerException, match="model control"):
        client.load_model("affine")


def test_grpc_health_service(server):
    """The standard grpc.health.v1 protocol, for Kubernetes gRPC probes."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        serving = health_pb2.HealthCheckResponse.SERVING
        assert stub.Check(health_pb2.HealthCheckRequest()).status == serving
        assert stub.Check(health_pb2.HealthCheckRequest(service="affine")).status == serving
        with pytest.raises(grpc.RpcError) as info:
            stub.Check(health_pb2.HealthCheckRequest(service="nope"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
