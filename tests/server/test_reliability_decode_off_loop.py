"""A large JSON request is decoded off the event loop: while a 49 MiB body is being decoded (a second or more), health
and metrics still answer within 100 ms. Issue 17 measured a 1.5 s stall.

The machine may be loaded, so latencies are compared with a baseline measured just before, on the same server, and
the probe is repeated: one slow probe is load; the decode stalling the loop shows as every probe during it taking as
long as the decode itself."""

from __future__ import annotations

import json
import statistics
import threading
import time

import httpx
import pytest
from serverproc import AFFINE_CONFIG, ServerProcess, make_repository

pytestmark = pytest.mark.slow

BODY_MIB = 49


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    repo = make_repository(tmp_path_factory.mktemp("decode"), {"affine": AFFINE_CONFIG})
    server = ServerProcess(repo)
    yield server
    assert server.stop() == 0, server.log_text


def big_body() -> bytes:
    """~49 MiB of JSON numbers for affine: decoded in full, then refused (its batch is over max_batch_size)."""
    rows = BODY_MIB * 2**20 // 40
    data = [0.123456789] * (rows * 4)
    return json.dumps({"inputs": [{"name": "in0", "shape": [rows, 4], "datatype": "FP32", "data": data}]}).encode()


def probe(client: httpx.Client, url: str) -> float:
    t0 = time.monotonic()
    assert client.get(url, timeout=30).status_code == 200
    return time.monotonic() - t0


def latencies_during_decode(srv: ServerProcess, body: bytes) -> tuple[float, list[float], list[float]]:
    """(seconds the big request took, health latencies, metrics latencies) probed while it was decoded."""
    health, metrics = [], []
    done = threading.Event()
    took: list[float] = []

    def big() -> None:
        t0 = time.monotonic()
        r = httpx.post(f"http://{srv.http_url}/v2/models/affine/infer", content=body, timeout=300)
        took.append(time.monotonic() - t0)
        assert r.status_code == 400 and "batch-size" in r.text, r.text[:300]
        done.set()

    with httpx.Client() as h, httpx.Client() as m:
        probe(h, f"http://{srv.http_url}/v2/health/ready")
        probe(m, srv.metrics_url)
        sender = threading.Thread(target=big)
        sender.start()
        time.sleep(0.2)  # the body is on its way; decoding starts once it is in
        while not done.is_set():
            health.append(probe(h, f"http://{srv.http_url}/v2/health/ready"))
            metrics.append(probe(m, srv.metrics_url))
            time.sleep(0.02)
        sender.join()
    return took[0], health, metrics


def baseline(srv: ServerProcess) -> float:
    with httpx.Client() as h:
        samples = [probe(h, f"http://{srv.http_url}/v2/health/ready") for _ in range(30)]
    return statistics.median(samples)


def test_health_and_metrics_answer_while_a_large_json_is_decoded(srv: ServerProcess) -> None:
    body = big_body()
    assert len(body) >= 48 * 2**20
    outcomes = []
    for _ in range(3):  # a loaded machine may spoil one round, not every one
        base = baseline(srv)
        took, health, metrics = latencies_during_decode(srv, body)
        typical = statistics.median(health + metrics)
        outcomes.append((took, base, typical, max(health + metrics), len(health)))
        if len(health) >= 5 and typical < 0.1 + 3 * base and max(health + metrics) < max(0.5, took / 3):
            break
    else:
        pytest.fail(f"(request s, baseline s, median probe s, worst probe s, probes) per round: {outcomes}")
    assert srv.proc.poll() is None
