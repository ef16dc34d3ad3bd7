"""The manifests agree with the server's code: ports, probe paths, the container's arguments (parsed by the real
`nnserve serve` parser), drain timings, the image's user and cache directory."""

from __future__ import annotations

import argparse

import pytest
from dockerfile import Dockerfile
from kube import REPO_ROOT, container, one

from server import settings
from server.cli import build_parser, run_serve

PORT_NAMES = {"http": settings.HTTP_PORT, "grpc": settings.GRPC_PORT, "metrics": settings.METRICS_PORT}


def parse_serve(args: list[str]) -> argparse.Namespace:
    """The container's args as `nnserve serve` (the image's ENTRYPOINT) parses them."""
    ns = build_parser().parse_args(["serve", *args])
    assert ns.func is run_serve
    return ns


def pod_spec(objects: list[dict]) -> dict:
    return one(objects, "Deployment")["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def image() -> Dockerfile:
    return Dockerfile.parse(REPO_ROOT / "Dockerfile")


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_container_runs_the_image_entrypoint_with_valid_args(rendered: dict, variant: str) -> None:
    spec = pod_spec(rendered[variant])
    c = container(one(rendered[variant], "Deployment"))
    assert "command" not in c, "the image's ENTRYPOINT (nnserve serve) must stay in charge"
    args = parse_serve(c["args"])
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts.get(str(args.model_repository)) == "models"
    assert any(v["name"] == "models" for v in spec["volumes"])


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_ports_agree_with_the_server_defaults_and_args(rendered: dict, variant: str) -> None:
    c = container(one(rendered[variant], "Deployment"))
    args = parse_serve(c["args"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == PORT_NAMES
    assert (args.http_port, args.grpc_port, args.metrics_port) == (ports["http"], ports["grpc"], ports["metrics"])
    service = one(rendered[variant], "Service")
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        name: (port, name) for name, port in PORT_NAMES.items()}
    monitor = one(rendered[variant], "ServiceMonitor")
    assert [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]] == [("metrics", settings.METRICS_PATH)]
    labels = service["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_probes_use_the_health_endpoints_and_tolerate_model_loading(rendered: dict, variant: str) -> None:
    c = container(one(rendered[variant], "Deployment"))
    probe = {kind: c[f"{kind}Probe"] for kind in ("startup", "readiness", "liveness")}
    assert {k: (p["httpGet"]["path"], p["httpGet"]["port"]) for k, p in probe.items()} == {
        "startup": (settings.READY_PATH, "http"), "readiness": (settings.READY_PATH, "http"),
        "liveness": (settings.LIVE_PATH, "http")}
    startup_budget = probe["startup"]["periodSeconds"] * probe["startup"]["failureThreshold"]
    assert startup_budget >= 120, "model loading plus numba compilation needs minutes on a cold pod"
    liveness_budget = probe["liveness"]["periodSeconds"] * probe["liveness"]["failureThreshold"]
    assert liveness_budget >= 30 and probe["liveness"]["timeoutSeconds"] >= 3


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_grace_period_covers_prestop_and_the_exit_timeout(rendered: dict, variant: str) -> None:
    spec = pod_spec(rendered[variant])
    c = container(one(rendered[variant], "Deployment"))
    exit_timeout = parse_serve(c["args"]).exit_timeout_secs  # the server's default unless the args raise it
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain_delay = float(pre_stop[1])
    assert drain_delay >= 5, "endpoint removal must reach every proxy before the server stops accepting"
    assert spec["terminationGracePeriodSeconds"] >= drain_delay + exit_timeout + 5


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_pod_matches_the_image_user_and_writable_paths(rendered: dict, variant: str, image: Dockerfile) -> None:
    spec = pod_spec(rendered[variant])
    c = container(one(rendered[variant], "Deployment"))
    uid = int(image.stages[-1].all("USER")[-1].value.split(":")[0])
    assert spec["securityContext"]["runAsUser"] == uid
    cache = {e["name"]: e.get("value") for e in c["env"]}["NUMBA_CACHE_DIR"]
    assert cache == image.env(image.stages[-1])["NUMBA_CACHE_DIR"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    writable = {m["mountPath"] for m in c["volumeMounts"]
                if not m.get("readOnly") and "emptyDir" in volumes[m["name"]]}
    assert {cache, "/tmp"} <= writable


def test_kserve_runtime_args_ports_and_probes_agree(rendered: dict) -> None:
    runtime = one(rendered["kserve"], "ClusterServingRuntime")["spec"]
    assert {f["name"] for f in runtime["supportedModelFormats"]} == {"tnn", "pnnx"}
    assert "v2" in runtime["protocolVersions"]
    (c,) = runtime["containers"]
    assert c["name"] == "kserve-container" and "command" not in c
    args = parse_serve(c["args"])
    assert str(args.model_repository) == "/mnt/models"  # where KServe's storage initializer puts storageUri
    assert [p["containerPort"] for p in c["ports"]] == [args.http_port]
    assert runtime["annotations"]["prometheus.kserve.io/port"] == str(args.metrics_port)
    assert runtime["annotations"]["prometheus.kserve.io/path"] == settings.METRICS_PATH
    for kind, path in (("startup", settings.READY_PATH), ("readiness", settings.READY_PATH),
                       ("liveness", settings.LIVE_PATH)):
        assert c[f"{kind}Probe"]["httpGet"] == {"path": path, "port": args.http_port}
    service = one(rendered["kserve"], "InferenceService")["spec"]["predictor"]["model"]
    assert service["runtime"] == one(rendered["kserve"], "ClusterServingRuntime")["metadata"]["name"]
    assert service["modelFormat"]["name"] in {"tnn", "pnnx"} and service["protocolVersion"] == "v2"
