"""Every rendered object is valid: built-in kinds against the Kubernetes OpenAPI schemas (kubernetes-validate,
strict: unknown fields fail), custom resources against the hand schemas in crd_schemas.py."""

from __future__ import annotations

import json

import jsonschema
import kubernetes_validate
import pytest
from crd_schemas import BY_KIND
from kube import KUBE_DIR, container, one

# The oldest and the newest Kubernetes the schemas ship for: the manifests must be valid on both.
K8S_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())
VARIANTS = ("cpu", "gpu", "cpu+model-pvc", "kserve")


def _validate_builtin(obj: dict, version: str) -> None:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} is invalid for Kubernetes {version}: {exc.message} "
                    f"at {'/'.join(map(str, exc.path))}")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_matches_its_schema(rendered: dict[str, list[dict]], variant: str, version: str) -> None:
    objects = rendered[variant]
    assert objects, f"{variant} rendered nothing"
    for obj in objects:
        if obj["kind"] in BY_KIND:
            jsonschema.validate(obj, BY_KIND[obj["kind"]])
        else:
            _validate_builtin(obj, version)


def test_crd_schemas_reject_typos(rendered: dict[str, list[dict]]) -> None:
    """The hand schemas are not vacuous: a misspelt field or a wrong protocol is caught."""
    monitor = json.loads(json.dumps(one(rendered["cpu"], "ServiceMonitor")))
    monitor["spec"]["endpoints"][0]["intervall"] = "10s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, BY_KIND["ServiceMonitor"])
    runtime = json.loads(json.dumps(one(rendered["kserve"], "ClusterServingRuntime")))
    runtime["spec"]["protocolVersions"].append("v3")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(runtime, BY_KIND["ClusterServingRuntime"])


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kserve_runtime_containers_are_valid_containers(rendered: dict[str, list[dict]], version: str) -> None:
    runtime = one(rendered["kserve"], "ClusterServingRuntime")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "runtime"},
           "spec": {"containers": runtime["spec"]["containers"]}}
    _validate_builtin(pod, version)


def test_overlays_render_the_full_set_of_objects(rendered: dict[str, list[dict]]) -> None:
    expected = {"Namespace", "ServiceAccount", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget",
                "HorizontalPodAutoscaler", "ServiceMonitor", "PrometheusRule"}
    for variant in ("cpu", "gpu"):
        assert {o["kind"] for o in rendered[variant]} == expected, variant
        namespaced = [o for o in rendered[variant] if o["kind"] != "Namespace"]
        assert {o["metadata"].get("namespace") for o in namespaced} == {"nnserve"}, variant


def test_gpu_overlay_asks_for_a_gpu_and_runs_the_cuda_image(rendered: dict[str, list[dict]]) -> None:
    gpu = container(one(rendered["gpu"], "Deployment"))
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert gpu["image"].endswith("-cuda")
    cpu = container(one(rendered["cpu"], "Deployment"))
    assert "nvidia.com/gpu" not in cpu["resources"]["limits"]
    for c in (cpu, gpu):
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]) and {"cpu", "memory"} <= set(
            c["resources"]["limits"])


def test_model_repository_default_is_the_init_container_and_pvc_is_the_alternative(
        rendered: dict[str, list[dict]]) -> None:
    default = one(rendered["cpu"], "Deployment")["spec"]["template"]["spec"]
    models = next(v for v in default["volumes"] if v["name"] == "models")
    assert "emptyDir" in models
    init = default["initContainers"][0]
    assert any(m["name"] == "models" for m in init["volumeMounts"])
    pvc = one(rendered["cpu+model-pvc"], "Deployment")["spec"]["template"]["spec"]
    assert "initContainers" not in pvc
    claim = next(v for v in pvc["volumes"] if v["name"] == "models")["persistentVolumeClaim"]["claimName"]
    assert one(rendered["cpu+model-pvc"], "PersistentVolumeClaim", claim)["metadata"]["namespace"] == "nnserve"


def test_pod_is_non_root_with_a_read_only_root_filesystem(rendered: dict[str, list[dict]]) -> None:
    for variant in ("cpu", "gpu", "cpu+model-pvc"):
        spec = one(rendered[variant], "Deployment")["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"], c["name"]


def test_dashboard_configmap_carries_the_dashboard_json(rendered: dict[str, list[dict]]) -> None:
    cm = one(rendered["cpu"], "ConfigMap", "nnserve-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["nnserve.json"])
    assert dashboard == json.loads((KUBE_DIR / "base" / "grafana-dashboard.json").read_text())
    assert dashboard["panels"] and all(p["targets"] for p in dashboard["panels"])
