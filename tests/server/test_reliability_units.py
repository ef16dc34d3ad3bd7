"""In-process checks of the security helpers and the gRPC interceptors (including the streaming rpc, which the
end-to-end tests do not restrict)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from server.errors import InvalidArgumentError
from server.inference import StreamResponse
from server.protocol.grpc import pb2, pb2_grpc
from server.protocol.grpc.interceptors import DecodeGuardInterceptor, RestrictedProtocolInterceptor
from server.protocol.grpc.servicer import InferenceServicer
from server.security import (
    RestrictionSpecError,
    check_model_name,
    escaping_paths,
    http_api_group,
    parse_restrictions,
)


def test_parse_restrictions_follows_tritons_syntax() -> None:
    rules = parse_restrictions(["model-repository,statistics:Admin-Key=a=b:c", "inference:k=v"], "--x")
    assert rules["model-repository"].key == "admin-key" and rules["statistics"].value == "a=b:c"
    assert rules["inference"].allows("v") and not rules["inference"].allows("V") and not rules["inference"].allows(None)
    for bad in ("inference", "inference:k", "nope:k=v", ":k=v", "inference:=v"):
        with pytest.raises(RestrictionSpecError):
            parse_restrictions([bad], "--x")
    with pytest.raises(RestrictionSpecError, match="more than one"):
        parse_restrictions(["inference:a=1", "inference,health:b=2"], "--x")


@pytest.mark.parametrize(("method", "path", "group"), [
    ("GET", "/v2", "metadata"), ("GET", "/v2/health/live", "health"), ("GET", "/v2/models/m/ready", "health"),
    ("GET", "/v2/models/m", "metadata"), ("GET", "/v2/models/m/versions/2", "metadata"),
    ("POST", "/v2/models/m/infer", "inference"), ("POST", "/v2/models/m/versions/1/infer", "inference"),
    ("GET", "/v2/models/m/config", "model-config"), ("GET", "/v2/models/stats", "statistics"),
    ("GET", "/v2/models/m/versions/1/stats", "statistics"), ("POST", "/v2/repository/index", "model-repository"),
    ("POST", "/v2/repository/models/m/load", "model-repository"), ("GET", "/v2/logging", "logging"),
    ("GET", "/v2/trace/setting", "trace"), ("GET", "/v2/systemsharedmemory/status", "shared-memory"),
    ("GET", "/v2/models/m/profile", "trace"), ("POST", "/v2/models/m/versions/1/profile", "trace"),
    ("GET", "/openapi.json", None), ("GET", "/metrics", None),
])
def test_http_api_groups(method: str, path: str, group: str | None) -> None:
    assert http_api_group(method, path) == group


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "/abs", "x\\y", "~user", "a\0b"])
def test_model_names_that_are_paths(name: str) -> None:
    assert check_model_name(name)


def test_plain_model_names() -> None:
    assert check_model_name("resnet50") is None and check_model_name("a.b-c_d") is None


def test_escaping_paths_sees_symlinks_out(tmp_path: Path) -> None:
    root, out = tmp_path / "repo", tmp_path / "out"
    (root / "m" / "1").mkdir(parents=True)
    out.mkdir()
    (out / "w.bin").write_bytes(b"x")
    assert escaping_paths(root, root / "m") == []
    (root / "m" / "1" / "w.bin").symlink_to(out / "w.bin")
    (root / "m" / "1" / "inside").symlink_to(root / "m")  # a link that stays inside is fine
    assert escaping_paths(root, root / "m") == ["1/w.bin"]
    (root / "link").symlink_to(out)
    assert escaping_paths(root, root / "link") == ["link/"]


class RefusingDataPlane:
    async def infer(self, req):  # noqa: ANN001, ANN201
        raise InvalidArgumentError(f"no thanks: {req.model_name}")

    async def infer_stream(self, req):  # noqa: ANN001, ANN201 - what ModelStreamInfer calls: errors come as responses
        yield StreamResponse(None, InvalidArgumentError(f"no thanks: {req.model_name}"))


async def _stream_calls() -> list:
    server = grpc.aio.server(interceptors=[
        RestrictedProtocolInterceptor(parse_restrictions(["inference:k=v"], "--grpc-restricted-protocol")),
        DecodeGuardInterceptor()])
    pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(RefusingDataPlane()), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        # The sync API, as tritonclient's streams use: grpc.aio's client can report INTERNAL "Internal error from
        # Core" instead of the server's status when its request write loses a race with the server ending the call
        # (grpc issue 36066), which is the client's fault, not the server's.
        return await asyncio.to_thread(_stream_calls_sync, port)
    finally:
        await server.stop(None)


def _stream_calls_sync(port: int) -> list:
    results = []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        for metadata in ((), (("triton-grpc-protocol-k", "v"),)):
            try:
                answers = list(stub.ModelStreamInfer(iter([pb2.ModelInferRequest(model_name="m")]),
                                                     metadata=metadata, timeout=10))
                results.append(("ok", [a.error_message for a in answers]))
            except grpc.RpcError as err:
                results.append((err.code(), err.details()))
    return results


def test_restricted_streaming_rpc() -> None:
    denied, allowed = asyncio.run(_stream_calls())
    assert denied == (grpc.StatusCode.UNAVAILABLE, "This protocol is restricted, expecting header "
                                                   "'triton-grpc-protocol-k'")
    assert allowed == ("ok", ["no thanks: m"])
