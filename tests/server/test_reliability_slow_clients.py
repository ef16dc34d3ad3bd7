"""Slow and idle HTTP clients against a real server with its limits lowered: a connection that sends nothing, half a
request or endless headers is closed; a body that stalls answers 408; and a slowloris of more half-sent requests than
the server may hold connections (and more than its open-file limit) does not lock other clients out."""

from __future__ import annotations

import contextlib
import socket
import time

import httpx
import pytest
from serverproc import AFFINE_CONFIG, ServerProcess, make_repository

pytestmark = pytest.mark.slow

TIMEOUT = 2.0  # header, body and idle timeouts of this server
OPEN_FILES = 256  # the server's descriptor limit
CONNECTIONS = 64  # its HTTP connection limit


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    repo = make_repository(tmp_path_factory.mktemp("slow"), {"affine": AFFINE_CONFIG})
    srv = ServerProcess(repo, "--http-header-timeout-secs", str(TIMEOUT), "--http-body-timeout-secs", str(TIMEOUT),
                        "--http-idle-timeout-secs", str(TIMEOUT), "--http-max-connections", str(CONNECTIONS),
                        "--http-max-header-size", "8192", open_files=OPEN_FILES)
    yield srv
    assert srv.stop() == 0, srv.log_text


def connect(srv: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.ports["http"]), timeout=30)


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """(whether the server closed the connection within `seconds`, what it sent before closing)."""
    sock.settimeout(seconds)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
        return True, data
    except TimeoutError:
        return False, data
    except ConnectionResetError:
        return True, data


def health_ok(srv: ServerProcess) -> float:
    """Seconds a new client takes to get 200 from /v2/health/live."""
    t0 = time.monotonic()
    assert httpx.get(f"http://{srv.http_url}/v2/health/live", timeout=30).status_code == 200
    return time.monotonic() - t0


def test_a_connection_that_sends_nothing_is_closed(guarded: ServerProcess) -> None:
    with connect(guarded) as sock:
        closed, _ = closed_within(sock, 10 * TIMEOUT)
        assert closed


def test_half_sent_headers_are_closed(guarded: ServerProcess) -> None:
    with connect(guarded) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        closed, _ = closed_within(sock, 10 * TIMEOUT)
        assert closed and time.monotonic() - t0 >= TIMEOUT * 0.5


def test_headers_dripping_one_byte_at_a_time_are_closed(guarded: ServerProcess) -> None:
    """The header timeout counts from the request's first byte: every byte resetting an idle timer would let one
    byte a second hold a connection forever."""
    with connect(guarded) as sock:
        t0 = time.monotonic()
        with contextlib.suppress(OSError):
            for b in b"GET /v2/health/live HTTP/1.1\r\nX-Slow: " + b"a" * 100:
                sock.sendall(bytes([b]))
                time.sleep(0.1)
                if time.monotonic() - t0 > 10 * TIMEOUT:
                    break
        closed, _ = closed_within(sock, 10 * TIMEOUT)
        assert closed and time.monotonic() - t0 < 10 * TIMEOUT


def test_endless_headers_answer_431(guarded: ServerProcess) -> None:
    with connect(guarded) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 50_000 + b"\r\n")
        closed, data = closed_within(sock, 10 * TIMEOUT)
        assert closed and data.startswith(b"HTTP/1.1 431"), data[:200]
        assert b"--http-max-header-size" in data


def test_a_stalled_body_answers_408(guarded: ServerProcess) -> None:
    with connect(guarded) as sock:
        sock.sendall(b"POST /v2/models/affine/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"inputs\"")
        closed, data = closed_within(sock, 10 * TIMEOUT)
        assert closed and data.startswith(b"HTTP/1.1 408"), data[:200]
        assert b"--http-body-timeout-secs" in data
    assert health_ok(guarded) < 10


def read_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length body (the health routes' are empty)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_a_busy_keep_alive_connection_outlives_the_timeouts(guarded: ServerProcess) -> None:
    """Each request moves the connection's deadlines (head, body, idle) on: one that keeps sending requests for
    longer than any timeout is never closed."""
    with connect(guarded) as sock:
        t0 = time.monotonic()
        served = 0
        while time.monotonic() - t0 < 2.5 * TIMEOUT:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock).startswith(b"HTTP/1.1 200"), served
            served += 1
            time.sleep(0.01)
        assert served > 10


def test_a_stalled_body_after_served_requests_answers_408(guarded: ServerProcess) -> None:
    """The body deadline of a connection's later request counts from that request's headers, not from an earlier
    deadline's."""
    with connect(guarded) as sock:
        for _ in range(3):
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock).startswith(b"HTTP/1.1 200")
        time.sleep(TIMEOUT * 0.75)  # most of the idle timeout: an earlier deadline still pending would fire soon
        sock.sendall(b"POST /v2/models/affine/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        t0 = time.monotonic()
        closed, data = closed_within(sock, 10 * TIMEOUT)
        assert closed and data.startswith(b"HTTP/1.1 408"), data[:200]
        assert time.monotonic() - t0 >= TIMEOUT * 0.5


def test_slowloris_does_not_lock_others_out(guarded: ServerProcess) -> None:
    """More half-sent requests than the connection limit, and than the server has descriptors, each kept open:
    every new client still gets its answer, and the half-sent ones are closed by the timeout."""
    attackers: list[socket.socket] = []
    try:
        for i in range(OPEN_FILES + 50):
            try:
                sock = socket.create_connection(("127.0.0.1", guarded.ports["http"]), timeout=5)
                sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            except OSError:
                continue  # the server (or the backlog) closed it: that is what the limit does
            attackers.append(sock)
            if i % 50 == 49:
                assert health_ok(guarded) < 10  # answered while the attack builds up
        for _ in range(5):
            assert health_ok(guarded) < 10
        r = httpx.post(f"http://{guarded.http_url}/v2/models/affine/infer", timeout=30, json={"inputs": [
            {"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
        assert r.status_code == 200, r.text
        # the half-sent requests still held are closed by the header timeout
        time.sleep(3 * TIMEOUT)
        still_open = [s for s in attackers if not closed_within(s, 0.01)[0]]
        assert not still_open, f"{len(still_open)} half-sent requests still open"
    finally:
        for sock in attackers:
            sock.close()
    assert guarded.proc.poll() is None
    assert "Traceback" not in guarded.log_text, guarded.log_text
