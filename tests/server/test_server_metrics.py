"""Prometheus endpoint: Triton's nv_* names and labels, our histograms, and batches above 1 under 8 clients."""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import tritonclient.http as httpclient
from serverproc import FIXTURES, sample

TRITON_NAMES = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
                "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count",
                "nv_model_load_duration_secs")


def scrape(server) -> str:
    r = httpx.get(server.metrics_url)
    assert r.status_code == 200
    return r.text


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
    one_infer(server.http_url)  # the labelled histogram exists once it has seen a batch (run alone, this is the first)
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


# ---- process and machine metrics -------------------------------------------------------------------------------
def proc_stat(busy: list[int], idle: int, iowait: int) -> str:
    """/proc/stat with an aggregate line: user nice system idle iowait irq softirq steal guest guest_nice."""
    user, nice, system, irq, softirq, steal = busy
    return (f"cpu  {user} {nice} {system} {idle} {iowait} {irq} {softirq} {steal} 7 0\n"
            f"cpu0 {user} {nice} {system} {idle} {iowait} {irq} {softirq} {steal} 7 0\nintr 1 2 3\n")


def test_cpu_utilization_is_the_busy_share_since_the_previous_scrape(tmp_path):
    from server.metrics import _CpuMetrics

    (tmp_path / "stat").write_text(proc_stat([100, 5, 40, 1, 2, 3], idle=1000, iowait=10))
    cpu = _CpuMetrics(tmp_path)
    assert cpu.utilization() is None  # nothing has elapsed since start-up
    # +30 busy (user 10, nice 1, system 9, irq 2, softirq 3, steal 4; guest is inside user) and +70 idle + iowait
    (tmp_path / "stat").write_text(proc_stat([110, 6, 49, 3, 6, 7], idle=1065, iowait=15))
    assert cpu.utilization() == 0.3
    assert cpu.utilization() == 0.3  # no tick elapsed: the previous figure, not 0/0
    (tmp_path / "stat").write_text(proc_stat([110, 6, 49, 3, 6, 7], idle=1165, iowait=15))
    assert cpu.utilization() == 0.0  # 100 idle ticks, none busy
    (tmp_path / "stat").write_text(proc_stat([1, 0, 0, 0, 0, 0], idle=1, iowait=0))
    assert cpu.utilization() == 0.0  # counters went back: keeps the last figure and starts afresh
    (tmp_path / "stat").write_text(proc_stat([4, 0, 0, 0, 0, 0], idle=2, iowait=0))
    assert cpu.utilization() == 0.75


def test_cpu_memory_is_total_and_total_minus_available(tmp_path):
    from server.metrics import _CpuMetrics

    (tmp_path / "meminfo").write_text("MemTotal:       2048 kB\nMemFree:         100 kB\nMemAvailable:    512 kB\n"
                                      "Buffers:          10 kB\nHugePages_Total:       0\n")
    assert _CpuMetrics(tmp_path).memory() == (2048 * 1024, 1536 * 1024)


def test_without_proc_the_cpu_samples_are_left_out_not_zero(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    from server.metrics import _CpuMetrics

    registry = CollectorRegistry()
    registry.register(_CpuMetrics(tmp_path / "absent"))
    text = generate_latest(registry).decode()
    assert "# TYPE nv_cpu_utilization gauge" in text
    assert not [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def test_process_and_machine_metrics_on_a_real_server(server):
    """process_* from prometheus-client's process collector, nv_cpu_* as Triton names them; the figures checked
    against /proc and against CPU time this test spends between two scrapes (a lower bound: others only add)."""
    wall0 = time.monotonic()  # before the first scrape: the server's window lies inside [wall0, end]
    first = scrape(server)
    assert 0.0 <= sample(first, "nv_cpu_utilization") <= 1.0
    meminfo = dict(ln.split(":", 1) for ln in Path("/proc/meminfo").read_text().splitlines())
    assert sample(first, "nv_cpu_memory_total_bytes") == int(meminfo["MemTotal"].split()[0]) * 1024
    assert 0 < sample(first, "nv_cpu_memory_used_bytes") < sample(first, "nv_cpu_memory_total_bytes")
    assert sample(first, "process_resident_memory_bytes") > 20e6  # numpy, numba and two models
    assert sample(first, "process_cpu_seconds_total") > 0 and sample(first, "process_open_fds") > 3
    # the server's own start: field 22 of /proc/<pid>/stat, in clock ticks after boot
    boot = next(float(ln.split()[1]) for ln in Path("/proc/stat").read_text().splitlines() if ln.startswith("btime"))
    ticks = int(Path(f"/proc/{server.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    assert abs(sample(first, "process_start_time_seconds") - (boot + ticks / os.sysconf("SC_CLK_TCK"))) < 1

    cpu0 = time.process_time()
    while time.process_time() - cpu0 < 0.5:  # burn half a CPU-second in this process, between the two scrapes
        pass
    busy_seconds = time.process_time() - cpu0
    second = scrape(server)
    wall = time.monotonic() - wall0
    cpus = sum(1 for ln in Path("/proc/stat").read_text().splitlines() if re.match(r"cpu\d+ ", ln))
    floor = busy_seconds / (wall * cpus)  # 0.8: /proc/stat counts whole 10 ms ticks
    assert sample(second, "nv_cpu_utilization") >= 0.8 * floor, (sample(second, "nv_cpu_utilization"), floor)
    assert sample(second, "process_cpu_seconds_total") >= sample(first, "process_cpu_seconds_total")
