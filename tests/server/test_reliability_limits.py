"""Request size limits on a real server: --http-max-input-size answers 413 from Content-Length before any of the body
is read, and caps chunked bodies while they stream; --grpc-max-message-size answers RESOURCE_EXHAUSTED."""

from __future__ import annotations

import json
import socket
import time

import grpc
import httpx
import numpy as np
import pytest
from serverproc import AFFINE_CONFIG, ServerProcess, make_repository

from server.protocol.grpc import pb2, pb2_grpc

pytestmark = pytest.mark.slow  # starts its own server

HTTP_LIMIT = 64 * 1024
GRPC_LIMIT = 256 * 1024


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    repo = make_repository(tmp_path_factory.mktemp("limrepo"), {"affine": AFFINE_CONFIG})
    srv = ServerProcess(repo, "--http-max-input-size", str(HTTP_LIMIT), "--grpc-max-message-size", str(GRPC_LIMIT))
    yield srv
    assert srv.stop() == 0, srv.log_text


def raw_http(srv: ServerProcess, head: str, body_parts: list[bytes], wait: float = 10) -> tuple[int, bytes, float]:
    """Send `head` and the parts, then read the answer: (status, response bytes, seconds until it arrived)."""
    with socket.create_connection(("127.0.0.1", srv.ports["http"]), timeout=wait) as sock:
        sock.sendall(head.encode())
        for part in body_parts:
            sock.sendall(part)
        t0 = time.monotonic()
        data = b""
        while not _complete(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return int(data.split(b" ", 2)[1]), data, time.monotonic() - t0


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    length = [ln.split(b":", 1)[1] for ln in head.lower().split(b"\r\n") if ln.startswith(b"content-length:")]
    return len(body) >= int(length[0]) if length else True


def test_content_length_over_the_limit_is_refused_before_the_body(limited: ServerProcess) -> None:
    """Content-Length claims 1 GB, no body byte is sent: the 413 comes anyway (nothing was buffered)."""
    head = (f"POST /v2/models/affine/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {2**30}\r\n\r\n")
    status, data, _ = raw_http(limited, head, [])
    assert status == 413, data
    assert b"--http-max-input-size" in data


def test_chunked_body_is_cut_off_while_streaming(limited: ServerProcess) -> None:
    """No Content-Length: the server counts while reading and answers 413 past the limit, without waiting for the
    end of the body (the terminating chunk is never sent)."""
    head = ("POST /v2/models/affine/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * 16384
    parts = [f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" for _ in range(2 * HTTP_LIMIT // len(chunk))]
    status, data, _ = raw_http(limited, head, parts)
    assert status == 413, data


def test_http_under_the_limit_still_served(limited: ServerProcess) -> None:
    body = {"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    assert len(json.dumps(body)) < HTTP_LIMIT
    assert httpx.post(f"http://{limited.http_url}/v2/models/affine/infer", json=body, timeout=30).status_code == 200


def grpc_request(n_bytes: int) -> pb2.ModelInferRequest:
    req = pb2.ModelInferRequest(model_name="affine")
    req.inputs.add(name="in0", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(np.zeros(n_bytes // 4, np.float32).tobytes())
    return req


def test_grpc_message_over_the_limit_is_resource_exhausted(limited: ServerProcess) -> None:
    options = [("grpc.max_send_message_length", 64 * 2**20)]
    with grpc.insecure_channel(limited.grpc_url, options=options) as channel:
        stub = pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(grpc_request(4 * GRPC_LIMIT), timeout=30)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value
        resp = stub.ModelInfer(grpc_request(16), timeout=30)  # the same channel keeps working
        assert len(resp.raw_output_contents) == 2
    assert limited.proc.poll() is None
