"""deploy/'s Prometheus pieces, checked by Prometheus's own promtool (Debian's `prometheus` package): every recording
and alert rule of base/prometheusrule.yaml on synthetic series (promtool/rules_test.yaml), every dashboard query
parsed as PromQL, and the plain scrape config for clusters without the Prometheus Operator validated, with its
relabelling applied to the rendered Deployment's pod."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from kube import KUBE_DIR, one

from server import settings

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed: Debian's `prometheus` package has it (apt-get install "
                             "prometheus); `make test` installs it when run as root with apt-get, as on CI")
RULE_TESTS = Path(__file__).resolve().parent / "promtool" / "rules_test.yaml"
SCRAPE_CONFIG = KUBE_DIR / "prometheus" / "scrape-config.yaml"
DASHBOARD = KUBE_DIR / "base" / "grafana-dashboard.json"


@pytest.fixture(scope="module")
def rule(rendered: dict) -> dict:
    return one(rendered["cpu"], "PrometheusRule")


def write_rule_file(rule: dict, path: Path) -> Path:
    """The PrometheusRule's groups as a Prometheus rule file (what the Operator hands Prometheus)."""
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    return path


def promtool(*args: str, cwd: Path) -> str:
    proc = subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"promtool {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_every_rule_has_unit_tests(rule: dict) -> None:
    """Each recording rule's values and each alert, firing and not firing, are in promtool/rules_test.yaml."""
    spec = yaml.safe_load(RULE_TESTS.read_text())
    exprs = {t["expr"] for case in spec["tests"] for t in case.get("promql_expr_test", [])}
    alerts = [t for case in spec["tests"] for t in case.get("alert_rule_test", [])]
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            if "record" in r:
                assert r["record"] in exprs, f"recording rule {r['record']} has no promtool test"
            else:
                cases = [a for a in alerts if a["alertname"] == r["alert"]]
                assert any(a["exp_alerts"] for a in cases), f"{r['alert']} is never tested firing"
                assert any(not a["exp_alerts"] for a in cases), f"{r['alert']} is never tested silent"


@needs_promtool
def test_rules_pass_promtool_check_and_unit_tests(rule: dict, tmp_path: Path) -> None:
    write_rule_file(rule, tmp_path / "rules.yaml")
    shutil.copy(RULE_TESTS, tmp_path / "rules_test.yaml")
    assert "SUCCESS" in promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert "SUCCESS" in promtool("test", "rules", "rules_test.yaml", cwd=tmp_path)


@needs_promtool
def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    records = [{"record": f"dashboard:query_{i}:check", "expr": e.replace("$namespace", "nnserve")}
               for i, e in enumerate(exprs)]
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    assert f"SUCCESS: {len(exprs)} rules found" in promtool("check", "rules", "dashboard.yaml", cwd=tmp_path)


# Debian's Prometheus is built without Kubernetes service discovery (promtool rejects kubernetes_sd_configs), so the
# check swaps it for file_sd_configs; the relabelling, the job and the rule file are checked as written.
@needs_promtool
def test_plain_scrape_config_is_valid(rule: dict, tmp_path: Path) -> None:
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    for job in config["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
        job["file_sd_configs"] = [{"files": ["pods.json"]}]
    (tmp_path / "pods.json").write_text("[]")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    (rule_file,) = config["rule_files"]
    write_rule_file(rule, tmp_path / rule_file)
    out = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert "SUCCESS: prometheus.yml is valid" in out and "SUCCESS: 7 rules found" in out


def relabel(rules: list[dict], labels: dict[str, str]) -> dict[str, str] | None:
    """Prometheus's `keep` and `replace` relabel actions (anchored regex, sources joined by ';', default $1)."""
    labels = dict(labels)
    for r in rules:
        value = ";".join(labels.get(s, "") for s in r["source_labels"])
        match = re.fullmatch(r.get("regex", "(.*)"), value)
        action = r.get("action", "replace")
        if action == "keep":
            if not match:
                return None
        elif action == "replace":
            if match:
                labels[r["target_label"]] = match.expand(r.get("replacement", "$1").replace("$", "\\"))
        else:
            raise AssertionError(f"relabel action {action} is not emulated here")
    return labels


def pod_discovery_labels(deployment: dict, namespace: str, name: str, ip: str) -> dict[str, str]:
    """The labels Kubernetes pod discovery gives a pod of this Deployment (one target per container port)."""
    meta = deployment["spec"]["template"]["metadata"]
    sanitize = lambda key: re.sub(r"[^a-zA-Z0-9_]", "_", key)  # noqa: E731
    labels = {"__address__": f"{ip}:{settings.HTTP_PORT}", "__meta_kubernetes_namespace": namespace,
              "__meta_kubernetes_pod_name": name, "__meta_kubernetes_pod_ip": ip, "__metrics_path__": "/metrics"}
    labels |= {f"__meta_kubernetes_pod_label_{sanitize(k)}": v for k, v in meta.get("labels", {}).items()}
    labels |= {f"__meta_kubernetes_pod_annotation_{sanitize(k)}": v for k, v in meta.get("annotations", {}).items()}
    return labels


def test_plain_scrape_config_scrapes_the_deployment_pods_metrics_port(rendered: dict) -> None:
    deployment = one(rendered["cpu"], "Deployment")
    container = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "nnserve")
    metrics_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": str(metrics_port),
                           "prometheus.io/path": settings.METRICS_PATH}
    assert metrics_port == settings.METRICS_PORT
    (job,) = yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"]
    pod = pod_discovery_labels(deployment, "nnserve", "nnserve-7d9f-abcde", "10.1.2.3")
    target = relabel(job["relabel_configs"], pod)
    assert target is not None, "the nnserve pod is not scraped"
    assert target["__address__"] == f"10.1.2.3:{metrics_port}"
    assert target["__metrics_path__"] == settings.METRICS_PATH
    assert target["namespace"] == "nnserve" and target["pod"] == "nnserve-7d9f-abcde"  # what the rules group by
    other = {k: v for k, v in pod.items() if "annotation_prometheus_io_scrape" not in k}
    assert relabel(job["relabel_configs"], other) is None, "a pod without the scrape annotation is scraped"
    stranger = {**pod, "__meta_kubernetes_pod_label_app_kubernetes_io_name": "other-app"}
    assert relabel(job["relabel_configs"], stranger) is None, "another application's annotated pod is scraped"
