"""A JSON request body costs the server a bounded multiple of its size, whatever its shape and however many clients
send one at once.

Decoded JSON is Python objects: '{"name":"o"}' (12 bytes) becomes a dict and what the request makes of it (~400
bytes), '[],' (3 bytes) a list of 64. 60 MiB of requested outputs took 2 GB before they were refused as duplicates,
and each client sending such a body at once added as much. Now a request holds at most
rest_codec.MAX_JSON_OBJECTS objects, and large bodies are decoded one at a time (decoding holds the GIL: two at once
take as long as one after the other)."""

from __future__ import annotations

import threading

import httpx
import pytest
from serverproc import AFFINE_CONFIG, ServerProcess, make_repository

pytestmark = pytest.mark.slow

INPUT = '{"name":"in0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}'


@pytest.fixture
def srv(tmp_path) -> ServerProcess:
    """A server per test: each measures its own peak RSS (VmHWM) from its start."""
    server = ServerProcess(make_repository(tmp_path / "repo", {"affine": AFFINE_CONFIG}))
    yield server
    assert server.stop() == 0, server.log_text


def post(srv: ServerProcess, body: bytes) -> httpx.Response:
    return httpx.post(f"http://{srv.http_url}/v2/models/affine/infer", content=body, timeout=300)


def test_millions_of_objects_are_refused_before_they_cost_gigabytes(srv: ServerProcess) -> None:
    body = ('{"inputs":[' + INPUT + '],"outputs":[' + ",".join(['{"name":"out0"}'] * (40 * 2**20 // 16)) +
            ']}').encode()
    base = srv.memory_mib("VmHWM")
    r = post(srv, body)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"] == "the request JSON holds more than 65536 objects (tensors, parameters)"
    growth = srv.memory_mib("VmHWM") - base
    assert growth <= 4 * len(body) / 2**20 + 64, growth  # before: 1.3 GB for these 40 MiB
    # braces inside strings are no objects: a request whose BYTES data holds many is served
    text = "{" * 70000
    ok = {"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}],
          "parameters": {"note": text}}
    r = httpx.post(f"http://{srv.http_url}/v2/models/affine/infer", json=ok, timeout=60)
    assert r.status_code == 200, r.text[:300]


def test_large_bodies_sent_at_once_are_decoded_one_at_a_time(srv: ServerProcess) -> None:
    """Four clients at once, each with 12 MiB of empty lists as an input's data (~20x their size once decoded, then
    refused): the peak is that of one such body decoded (measured first, alone) plus the bodies themselves, not four
    times it."""
    lists = ",".join(["[]"] * (12 * 2**20 // 3))
    body = ('{"inputs":[{"name":"in0","shape":[1,4],"datatype":"FP32","data":[' + lists + ']}]}').encode()
    base = srv.memory_mib("VmHWM")
    r = post(srv, body)
    assert r.status_code == 400, r.text[:300]
    one = srv.memory_mib("VmHWM") - base
    assert one > 5 * len(body) / 2**20, one  # the amplification this test is about is there
    answers: list[int] = []  # status codes
    threads = [threading.Thread(target=lambda: answers.append(post(srv, body).status_code)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [400] * 4
    four = srv.memory_mib("VmHWM") - base
    assert four <= one + 4 * 3 * len(body) / 2**20 + 64, (one, four)  # bodies: received, joined, decoded text
    assert srv.proc.poll() is None
