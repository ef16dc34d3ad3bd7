"""Every metric the HPA, prometheus-adapter, the PrometheusRule and the Grafana dashboard use is one the server
really exposes (read from a live server.metrics registry, not from a list) or one our recording rules define."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from kube import KUBE_DIR, one

from server.metrics import ServerMetrics

# every metric we could reference starts like this; anything else (sum, rate, by, labels) is PromQL
METRIC_NAME = re.compile(r"(?<![\w:])(nv_\w+|nnserve[_:][\w:]+)")
SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]")


@pytest.fixture(scope="module")
def exposed() -> set[str]:
    """Sample names on /metrics, as Prometheus stores them, after one of each recorded event."""
    m = ServerMetrics()
    m.model_loaded("m", "1", 0.5, [1024])
    m.request_ok("m", "1", total_ns=2000, queue_ns=500, input_ns=100, infer_ns=1000, output_ns=100, batch=1)
    m.request_failed("m", "1", "REJECTED", 10)
    m.execution("m", "1", 1)
    lines = m.render().decode().splitlines()
    return {SAMPLE_LINE.match(ln).group(1) for ln in lines if ln and not ln.startswith("#")}


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
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    assert len(families) >= 10, "the dashboard covers the server's metrics"
