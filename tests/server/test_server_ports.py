"""A port that is already taken: the server exits 1 with one line naming address, port and endpoint, instead of a
traceback, or (gRPC, which sets SO_REUSEPORT by default) silently sharing the port with another server."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from serverproc import AFFINE_CONFIG, ServerProcess, make_repository

pytestmark = pytest.mark.slow  # starts servers


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A listening socket with SO_REUSEPORT, as another gRPC server holds its port: grpc's default would join it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield sock.getsockname()[1]
    sock.close()


@pytest.mark.parametrize("flag, endpoint", [("--grpc-port", "gRPC"), ("--http-port", "HTTP"),
                                            ("--metrics-port", "metrics")])
def test_taken_port_exits_1_with_one_line(tmp_path, taken_port, flag, endpoint):
    repo = make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG})
    srv = ServerProcess(repo, flag, str(taken_port), expect_ready=False)  # a later flag overrides port 0
    assert srv.proc.wait(60) == 1, srv.log_text
    lines = [ln for ln in srv.log if f"cannot listen on 127.0.0.1:{taken_port} ({endpoint})" in ln]
    assert len(lines) == 1 and "ERROR" in lines[0], srv.log_text
    assert "Traceback" not in srv.log_text and "nnserve listening" not in srv.log_text
