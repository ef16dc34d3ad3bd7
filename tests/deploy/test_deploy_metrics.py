"""Every metric the HPA, prometheus-adapter, the PrometheusRule and the Grafana dashboard use is one a real server
exposes (scraped from `nnserve serve` on the bundled repository after a served and a refused request, not taken
from a list) or one our recording rules define."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from kube import KUBE_DIR, REPO_ROOT, one
from liveserver import LiveServer

from server import settings

# every metric we could reference starts like this; anything else (sum, rate, by, labels) is PromQL
METRIC_NAME = re.compile(r"(?<![\w:])(nv_\w+|nnserve[_:][\w:]+|process_\w+)")
SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """`nnserve serve` on the bundled repository, as a pod runs it."""
    script = Path(sys.executable).parent / "nnserve"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "server.cli"]
    argv += ["serve", "--model-repository", str(REPO_ROOT / "model_repository"), "--http-port", "0",
             "--grpc-port", "0", "--metrics-port", "0"]
    server = LiveServer(argv, {**os.environ, "PYTHONUNBUFFERED": "1"}, tmp_path_factory.mktemp("live"))
    try:
        server.wait_ready()
        yield server
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(settings.EXIT_TIMEOUT_SECS + 30) == 0, server.log_text
    finally:
        server.stop()


@pytest.fixture(scope="module")
def exposed(live: LiveServer) -> set[str]:
    """Sample names on /metrics, as Prometheus stores them, after one request served and one refused."""
    good = {"name": "input", "shape": [1, 3, 240, 320], "datatype": "FP32",
            "data": np.zeros(3 * 240 * 320, np.float32).tolist()}
    assert httpx.post(live.url("/v2/models/ultraface_tnn/infer"), json={"inputs": [good]},
                      timeout=120).status_code == 200
    bad = {"name": "input", "shape": [1, 3], "datatype": "FP32", "data": [0.0, 0.0, 0.0]}
    assert httpx.post(live.url("/v2/models/ultraface_tnn/infer"), json={"inputs": [bad]},
                      timeout=120).status_code == 400
    text = httpx.get(live.url(settings.METRICS_PATH, "metrics"), timeout=30).text
    assert 'nv_inference_request_failure{model="ultraface_tnn",reason="REJECTED",version="1"} 1.0' in text
    return {SAMPLE_LINE.match(ln).group(1) for ln in text.splitlines() if ln and not ln.startswith("#")}


@pytest.fixture(scope="module")
def rule(rendered: dict) -> dict:
    return one(rendered["cpu"], "PrometheusRule")


@pytest.fixture(scope="module")
def adapter_rules() -> list[dict]:
    values = yaml.safe_load((KUBE_DIR / "prometheus-adapter" / "values.yaml").read_text())
    return values["rules"]["custom"]


def recorded(rule: dict) -> dict[str, str]:
    return {r["record"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"] if "record" in r}


def names_in(expr: str) -> set[str]:
    return set(METRIC_NAME.findall(expr))


def test_the_server_exposes_the_triton_names_the_rules_are_built_on(exposed: set[str]) -> None:
    assert {"nv_inference_queue_duration_us", "nv_inference_compute_infer_duration_us",
            "nv_inference_pending_request_count", "nv_inference_request_success"} <= exposed
    # Triton's machine CPU metrics and prometheus-client's process collector
    assert {"nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes",
            "process_cpu_seconds_total", "process_resident_memory_bytes", "process_start_time_seconds"} <= exposed


def test_prometheus_rule_reads_only_exposed_metrics(rule: dict, exposed: set[str]) -> None:
    records = recorded(rule)
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            unknown = names_in(r["expr"]) - exposed - set(records)
            assert not unknown, f"{r.get('record') or r.get('alert')} uses unknown metrics {unknown}"


def test_autoscaling_records_are_per_pod(rule: dict) -> None:
    """prometheus-adapter maps series to pods through their namespace and pod labels."""
    records = recorded(rule)
    for name in ("nnserve:queue_compute:ratio", "nnserve:pending_requests:sum"):
        assert re.search(r"by \(namespace, pod\)", records[name]), name
    ratio = records["nnserve:queue_compute:ratio"]
    assert ratio.index("nv_inference_queue_duration_us") < ratio.index("/") < ratio.index(
        "nv_inference_compute_infer_duration_us"), "queue time over compute time"


def test_hpa_metrics_come_from_the_adapter_which_reads_our_records(rendered: dict, rule: dict,
                                                                   adapter_rules: list[dict]) -> None:
    hpa = one(rendered["cpu"], "HorizontalPodAutoscaler")
    wanted = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    assert wanted, "the HPA scales on per-pod queue metrics"
    served = {}
    for r in adapter_rules:
        (series,) = names_in(r["seriesQuery"])
        assert re.fullmatch(r["name"]["matches"], series)
        assert series in recorded(rule), f"adapter reads {series}, which no recording rule produces"
        assert set(r["resources"]["overrides"]) == {"namespace", "pod"}
        assert "<<.Series>>" in r["metricsQuery"] and "<<.LabelMatchers>>" in r["metricsQuery"]
        served[r["name"]["as"]] = series
    assert wanted <= set(served), f"the HPA asks for {wanted - set(served)}, which the adapter does not serve"
    assert one(rendered["cpu"], "Deployment")["metadata"]["name"] == hpa["spec"]["scaleTargetRef"]["name"]


def test_dashboard_uses_only_exposed_or_recorded_metrics(rule: dict, exposed: set[str]) -> None:
    dashboard = json.loads((KUBE_DIR / "base" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    used = set().union(*(names_in(e) for e in exprs))
    assert not used - exposed - set(recorded(rule)), f"unknown metrics {used - exposed - set(recorded(rule))}"
    assert {"nnserve:queue_compute:ratio", "nnserve:pending_requests:sum"} <= used, "the HPA signals are shown"
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "nv_cpu_utilization"} <= used
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    assert len(families) >= 10, "the dashboard covers the server's metrics"
