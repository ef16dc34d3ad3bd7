"""The infer route's edge cases against a real server (the ASGI fast path in front of the FastAPI app, on the
guarded uvicorn protocol): Triton's answers for unknown models and versions, version routes, the binary data
extension, compression both ways, body limits and malformed lengths, and a client hanging up on a keep-alive
connection."""

from __future__ import annotations

import gzip
import json
import socket
import zlib

import httpx
import numpy as np
import pytest
from serverproc import AFFINE_CONFIG, ServerProcess, affine_reference, make_repository

LIMIT = 4096  # the server's --http-max-input-size
X = np.arange(4, dtype=np.float32).reshape(1, 4)
JSON_BODY = {"inputs": [{"name": "in0", "datatype": "FP32", "shape": [1, 4], "data": X.ravel().tolist()}]}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    repo = make_repository(tmp_path_factory.mktemp("route"), {"affine": AFFINE_CONFIG})
    server = ServerProcess(repo, "--http-max-input-size", str(LIMIT))
    yield server
    assert server.stop() == 0, server.log_text


def post(srv: ServerProcess, path: str, content: bytes, **headers: str) -> httpx.Response:
    return httpx.post(f"http://{srv.http_url}{path}", content=content, headers=headers, timeout=30)


def raw(srv: ServerProcess, request: bytes) -> bytes:
    """One request on a fresh connection; everything the server sends until it closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", srv.ports["http"]), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        try:
            while b"\r\n\r\n" not in data or len(data) < _expected(data):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            pass
        return data


def _expected(data: bytes) -> int:
    head, _, _ = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(head) + 4 + int(line.split(b":")[1])
    return len(data)


def check_outputs(body: dict) -> None:
    ref = affine_reference(X)
    outs = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in body["outputs"]}
    for name, want in ref.items():
        np.testing.assert_allclose(outs[name], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["/v2/models/affine/infer", "/v2/models/affine/versions/1/infer"])
def test_json_infer_on_both_routes(srv: ServerProcess, path: str) -> None:
    r = post(srv, path, json.dumps(JSON_BODY).encode(), **{"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    check_outputs(r.json())


@pytest.mark.parametrize(("path", "status", "message"), [
    ("/v2/models/nope/infer", 404, "Request for unknown model: 'nope' is not found"),
    ("/v2/models/nope/versions/1/infer", 404, "Request for unknown model: 'nope' is not found"),
    ("/v2/models/affine/versions/9/infer", 404, "Request for unknown model: 'affine' version 9 is not found"),
    ("/v2/models/affine/versions/x/infer", 400, "failed to get model version from specified version string 'x'"),
])
def test_unknown_models_and_versions_answer_as_triton(srv: ServerProcess, path: str, status: int,
                                                      message: str) -> None:
    r = post(srv, path, json.dumps(JSON_BODY).encode())
    assert r.status_code == status and r.json()["error"].startswith(message), r.text


def test_a_content_type_is_not_required_nor_trusted(srv: ServerProcess) -> None:
    # Triton reads the body by Inference-Header-Content-Length, whatever Content-Type says
    for content_type in ("text/plain", "application/octet-stream"):
        r = post(srv, "/v2/models/affine/infer", json.dumps(JSON_BODY).encode(), **{"Content-Type": content_type})
        assert r.status_code == 200, r.text
        check_outputs(r.json())


def test_binary_input_and_binary_outputs(srv: ServerProcess) -> None:
    head = json.dumps({"inputs": [{"name": "in0", "datatype": "FP32", "shape": [1, 4],
                                   "parameters": {"binary_data_size": 16}}],
                       "outputs": [{"name": "out0", "parameters": {"binary_data": True}}]}).encode()
    r = post(srv, "/v2/models/affine/infer", head + X.tobytes(), **{"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    json_len = int(r.headers["inference-header-content-length"])
    meta = json.loads(r.content[:json_len])
    assert [o["name"] for o in meta["outputs"]] == ["out0"]
    size = meta["outputs"][0]["parameters"]["binary_data_size"]
    out = np.frombuffer(r.content[json_len:json_len + size], np.float32).reshape(1, 3)
    np.testing.assert_allclose(out, affine_reference(X)["out0"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("value", "message"), [
    ("abc", "Inference-Header-Content-Length must be an integer, got 'abc'"),
    ("99999", "Inference-Header-Content-Length 99999 is outside the body of"),
    ("-1", "Inference-Header-Content-Length -1 is outside the body of"),
])
def test_a_bad_header_length_is_refused(srv: ServerProcess, value: str, message: str) -> None:
    r = post(srv, "/v2/models/affine/infer", json.dumps(JSON_BODY).encode(),
             **{"Inference-Header-Content-Length": value})
    assert r.status_code == 400 and r.json()["error"].startswith(message), r.text


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_request_and_response(srv: ServerProcess, encoding: str) -> None:
    body = json.dumps(JSON_BODY).encode()
    packed = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    r = httpx.post(f"http://{srv.http_url}/v2/models/affine/infer", content=packed, timeout=30,
                   headers={"Content-Encoding": encoding, "Accept-Encoding": encoding})
    assert r.status_code == 200, r.text
    assert r.headers["content-encoding"] == encoding
    check_outputs(r.json())  # httpx inflates it


def test_unknown_content_encoding_and_a_bomb_are_refused(srv: ServerProcess) -> None:
    r = post(srv, "/v2/models/affine/infer", b"xx", **{"Content-Encoding": "br"})
    assert r.status_code == 501 and "unsupported Content-Encoding 'br'" in r.json()["error"], r.text
    bomb = gzip.compress(b" " * (LIMIT * 4))
    r = post(srv, "/v2/models/affine/infer", bomb, **{"Content-Encoding": "gzip"})
    assert r.status_code == 413 and "decompressed request exceeds" in r.json()["error"], r.text


def test_oversized_bodies_are_refused_declared_or_not(srv: ServerProcess) -> None:
    big = b"x" * (LIMIT + 1)
    r = post(srv, "/v2/models/affine/infer", big)
    assert r.status_code == 413 and "exceeds the 4096-byte limit" in r.json()["error"], r.text
    # chunked: no Content-Length, counted as it arrives
    r = httpx.post(f"http://{srv.http_url}/v2/models/affine/infer", content=iter([big[:LIMIT], big[LIMIT:]]),
                   timeout=30)
    assert r.status_code == 413, r.text


def test_malformed_content_length_is_a_bad_request(srv: ServerProcess) -> None:
    data = raw(srv, b"POST /v2/models/affine/infer HTTP/1.1\r\nHost: x\r\nContent-Length: ab\r\n\r\n{}")
    assert data.startswith(b"HTTP/1.1 400"), data[:200]


def test_requests_on_one_keep_alive_connection_after_a_refusal(srv: ServerProcess) -> None:
    with httpx.Client(timeout=30) as client:
        url = f"http://{srv.http_url}/v2/models/affine/infer"
        assert client.post(url, content=b"{").status_code == 400
        for _ in range(3):
            r = client.post(url, content=json.dumps(JSON_BODY).encode())
            assert r.status_code == 200, r.text
            check_outputs(r.json())
