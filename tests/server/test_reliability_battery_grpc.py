"""Bad requests over gRPC: each answers a status (INVALID_ARGUMENT, NOT_FOUND, ...) as Triton does, the server keeps
serving, and a correct request afterwards gets the correct answer. Includes bytes that are not a valid protobuf."""

from __future__ import annotations

import struct

import grpc
import numpy as np
import pytest
from serverproc import ServerProcess, affine_reference

from server.protocol.grpc import pb2, pb2_grpc

INVALID = grpc.StatusCode.INVALID_ARGUMENT
INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"


def request(name: str = "in0", datatype: str = "FP32", shape: tuple = (1, 4), raw: bytes | None = None,
            model: str = "affine", **params: str) -> pb2.ModelInferRequest:
    req = pb2.ModelInferRequest(model_name=model)
    req.inputs.add(name=name, datatype=datatype, shape=list(shape))
    req.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes() if raw is None else raw)
    for k, v in params.items():
        req.parameters[k].string_param = v
    return req


def with_param(key: str, kind: str, value: int | float) -> pb2.ModelInferRequest:
    req = request()
    setattr(req.parameters[key], kind, value)
    return req


def typed(values: list[float], shape: tuple = (1, 4)) -> pb2.ModelInferRequest:
    req = pb2.ModelInferRequest(model_name="affine")
    t = req.inputs.add(name="in0", datatype="FP32", shape=list(shape))
    t.contents.fp32_contents.extend(values)
    return req


def two_inputs(second: str) -> pb2.ModelInferRequest:
    req = request()
    req.inputs.add(name=second, datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(np.zeros(4, np.float32).tobytes())
    return req


def no_inputs() -> pb2.ModelInferRequest:
    return pb2.ModelInferRequest(model_name="affine")


def raw_count_mismatch() -> pb2.ModelInferRequest:
    req = request()
    req.raw_input_contents.append(b"\0" * 16)
    return req


CASES = [
    ("wrong_shape", request(shape=(1, 5), raw=b"\0" * 20), INVALID, "unexpected shape"),
    ("wrong_dtype", request(datatype="INT32"), INVALID, "data-type"),
    ("unknown_dtype", request(datatype="FP8"), INVALID, "unsupported datatype"),
    ("wrong_name", request(name="inx"), INVALID, "unexpected inference input 'inx'"),
    ("missing_input", no_inputs(), INVALID, "missing required input"),
    ("extra_input", two_inputs("extra"), INVALID, "unexpected inference input 'extra'"),
    ("raw_count_mismatch", raw_count_mismatch(), INVALID, "raw_input_contents has 2 entries"),
    ("truncated_raw", request(raw=b"\0" * 8), INVALID, "got 8 bytes"),
    ("bytes_lying_length", request(datatype="BYTES", shape=(1, 1), raw=struct.pack("<I", 1000) + b"abc"), INVALID,
     "claims 1000 bytes"),
    ("huge_dims", request(shape=(2**40, 2**40)), INVALID, "needs"),
    ("negative_dims", request(shape=(-1, 4)), INVALID, "negative dim"),
    ("huge_batch", request(shape=(9, 4), raw=b"\0" * 144), INVALID, "batch-size"),
    ("gigantic_contents", typed([0.5] * 2_000_000), INVALID, "2000000 values"),
    ("timeout_not_int", request(timeout="soon"), INVALID,
     "Unable to parse 'timeout': expected an unsigned 64-bit integer, got \"soon\""),
    ("timeout_negative", with_param("timeout", "int64_param", -5), INVALID,
     "Unable to parse 'timeout': expected an unsigned 64-bit integer, got -5"),
    ("timeout_fraction", with_param("timeout", "double_param", 1.5), INVALID,
     "Unable to parse 'timeout': expected an unsigned 64-bit integer, got 1.5"),
    ("priority_negative", with_param("priority", "int64_param", -1), INVALID,
     "Unable to parse 'priority': expected an unsigned 64-bit integer, got -1"),
    ("priority_number_string", request(priority="2"), INVALID,
     "Unable to parse 'priority': expected an unsigned 64-bit integer, got \"2\""),
    ("unknown_model", request(model="nope"), grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'nope' is not "
     "found"),  # Triton 2.51
    ("unknown_version", pb2.ModelInferRequest(model_name="affine", model_version="7"), grpc.StatusCode.NOT_FOUND,
     "version 7"),
]


@pytest.fixture(scope="module")
def stub(server: ServerProcess):
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request_answers_status(stub, case: tuple) -> None:
    _, req, code, words = case
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(req, timeout=60)
    assert info.value.code() == code, info.value.details()
    assert words in info.value.details()


def test_bytes_that_are_not_a_request(server: ServerProcess) -> None:
    """Invalid UTF-8 in a string field and plain garbage never reach the handler: gRPC refuses to parse them."""
    valid = request().SerializeToString()
    bad_utf8 = valid.replace(b"affine", b"aff\xff\xfee")
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary(INFER_METHOD)  # no serializers: bytes on the wire as given
        for payload in (bad_utf8, b"\xff" * 64):
            with pytest.raises(grpc.RpcError) as info:
                call(payload, timeout=30)
            assert info.value.code() in (grpc.StatusCode.INTERNAL, INVALID), info.value
    assert server.proc.poll() is None


def test_nan_and_inf_are_data_over_grpc(stub) -> None:
    """Typed floats may be NaN/Inf on the wire (Triton computes them like any value); the answer follows IEEE."""
    resp = stub.ModelInfer(typed([float("nan"), float("inf"), 1.0, 2.0]), timeout=30)
    out1 = np.frombuffer(resp.raw_output_contents[1], np.float32)
    assert out1.shape == (3,) and np.isnan(out1).all()  # a NaN input reaches every output of the linear layer


def test_stream_reports_errors_and_keeps_going(stub) -> None:
    reqs = [request(name="inx"), request(shape=(-1, 4)), request()]
    answers = list(stub.ModelStreamInfer(iter(reqs), timeout=60))
    errors = sorted(a.error_message for a in answers if a.error_message)
    assert len(answers) == 3 and len(errors) == 2, answers
    assert [a for a in answers if not a.error_message][0].infer_response.model_name == "affine"


def test_server_still_correct_after_the_battery(server: ServerProcess, stub) -> None:
    for _, req, _, _ in CASES:
        with pytest.raises(grpc.RpcError):
            stub.ModelInfer(req, timeout=60)
    x = np.array([[0.5, -1.0, 2.0, 3.5]], np.float32)
    resp = stub.ModelInfer(request(raw=x.tobytes()), timeout=30)
    got = {o.name: np.frombuffer(raw, np.float32).reshape(o.shape)
           for o, raw in zip(resp.outputs, resp.raw_output_contents, strict=True)}
    for name, expected in affine_reference(x).items():
        np.testing.assert_allclose(got[name], expected, rtol=1e-5, atol=1e-6)
    assert server.proc.poll() is None
    assert "Traceback" not in server.log_text, server.log_text


def test_stream_with_a_malformed_message_ends_with_invalid_argument(server: ServerProcess) -> None:
    good = request().SerializeToString()
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        answers = []
        with pytest.raises(grpc.RpcError) as info:
            for answer in call(iter([good, b"\xff" * 32, good]), timeout=30):
                answers.append(answer)
    assert info.value.code() == INVALID, info.value
    assert "malformed request message" in info.value.details()
    assert server.proc.poll() is None
