"""Prometheus endpoint: Triton's nv_* names and labels, our histograms, and batches above 1 under 8 clients."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import tritonclient.http as httpclient
from serverproc import FIXTURES

TRITON_NAMES = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
                "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count",
                "nv_model_load_duration_secs")


def scrape(server) -> str:
    r = httpx.get(server.metrics_url)
    assert r.status_code == 200
    return r.text


def sample(text: str, name: str, **labels: str) -> float:
    """Value of the first sample line `name{...labels...} value` (a plain reader: sample names stay exact)."""
    for line in text.splitlines():
        m = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    raise AssertionError(f"no sample {name}{labels}")


def planned_activation_bytes() -> int:
    """Arena + workspace the engine plans for the session server's `affine` (max_batch_size 8, dims [4])."""
    import engine

    model = engine.load(FIXTURES / "affine" / "1" / "model.pnnx.param")
    plan = model.instance("cpu", max_shapes={"in0": (8, 4)}).memory_plan
    return plan.arena_bytes + plan.workspace_bytes


def one_infer(url: str) -> None:
    client = httpclient.InferenceServerClient(url)
    inp = httpclient.InferInput("in0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.ones((1, 4), np.float32))
    client.infer("affine", [inp])


def test_triton_names_and_labels(server):
    one_infer(server.http_url)
    text = scrape(server)
    for name in TRITON_NAMES:
        # exactly Triton's sample names: no `_total` suffix on the cumulative counters
        assert re.search(rf"^{name}\{{[^}}]*model=\"affine\"[^}}]*version=\"1\"", text, re.M), name
        assert f"# TYPE {name} " in text
    assert sample(text, "nv_inference_request_success", model="affine", version="1") >= 1
    assert 'reason="REJECTED"' in text
    arena = sample(text, "nnserve_arena_bytes", model="affine", instance="0", device="cpu")
    assert arena > 0 and arena == planned_activation_bytes()
    assert sample(text, "nnserve_arena_bytes", model="affine", instance="1", device="cpu") == arena
    for hist in ("nnserve_request_duration_seconds", "nnserve_queue_duration_seconds",
                 "nnserve_compute_duration_seconds", "nnserve_batch_size"):
        assert sample(text, f"{hist}_count", model="affine") >= 1


def test_failure_reason_counted(server):
    before = sample(scrape(server), "nv_inference_request_failure", model="affine", reason="REJECTED")
    httpx.post(f"http://{server.http_url}/v2/models/affine/infer",
               json={"inputs": [{"name": "in0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]})
    after = sample(scrape(server), "nv_inference_request_failure", model="affine", reason="REJECTED")
    assert after == before + 1


def test_concurrent_clients_form_batches(server):
    """8 clients at once against a 20 ms queue delay: the batch-size histogram must see batches above 1."""
    before = scrape(server)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: one_infer(server.http_url), range(32)))
    text = scrape(server)
    le1 = sample(text, "nnserve_batch_size_bucket", model="affine", le="1.0") - sample(
        before, "nnserve_batch_size_bucket", model="affine", le="1.0")
    total = sample(text, "nnserve_batch_size_count", model="affine") - sample(
        before, "nnserve_batch_size_count", model="affine")
    assert total < 32 and le1 < total  # fewer executions than requests, some of them batched
    execs = sample(text, "nv_inference_exec_count", model="affine") - sample(before, "nv_inference_exec_count",
                                                                             model="affine")
    assert execs == total
