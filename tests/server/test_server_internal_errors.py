"""In-process REST/gRPC adapter checks: unexpected exceptions keep the error shape (never a traceback), and
the HTTP body limit holds before and after decompression."""

from __future__ import annotations

import asyncio

import grpc
from fastapi.testclient import TestClient

from server.protocol.grpc import pb2
from server.protocol.grpc.servicer import InferenceServicer
from server.protocol.rest import create_app


class BrokenDataPlane:
    draining = exiting = False

    def server_metadata(self):
        raise RuntimeError("boom")


def test_rest_unexpected_error_is_json_500():
    client = TestClient(create_app(BrokenDataPlane()), raise_server_exceptions=False)
    r = client.get("/v2")
    assert r.status_code == 500 and r.json() == {"error": "internal error: RuntimeError: boom"}


class FakeContext:
    """The call's status is set on the context (never raised with context.abort: see servicer.fail)."""

    def set_code(self, code):
        self.code = code

    def set_details(self, details):
        self.details = details


def test_grpc_unexpected_error_is_internal():
    context = FakeContext()
    assert asyncio.run(InferenceServicer(BrokenDataPlane()).ServerMetadata(pb2.ServerMetadataRequest(),
                                                                           context)) is None
    assert context.code == grpc.StatusCode.INTERNAL and "RuntimeError: boom" in context.details


def test_rest_body_limit_applies_before_and_after_decompression():
    import gzip

    client = TestClient(create_app(BrokenDataPlane(), max_input_bytes=100), raise_server_exceptions=False)
    r = client.post("/v2/models/m/infer", content=b"x" * 200)
    assert r.status_code == 413 and "--http-max-input-size" in r.json()["error"]
    bomb = gzip.compress(b"0" * 10_000)
    assert len(bomb) < 100
    r = client.post("/v2/models/m/infer", content=bomb, headers={"Content-Encoding": "gzip"})
    assert r.status_code == 413 and "decompressed" in r.json()["error"]
