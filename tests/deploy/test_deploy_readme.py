"""deploy/README.md stays true: the paths it names exist, the commands it gives point at real kustomizations,
its first request matches the bundled model, and its sizing claims match the manifests."""

from __future__ import annotations

import re

from kube import DEPLOY_DIR, REPO_ROOT, container, one

README = (DEPLOY_DIR / "README.md").read_text()


def test_every_path_it_names_exists() -> None:
    paths = set(re.findall(r"(?<![\w/.])((?:deploy/|\.\./)?(?:kubernetes|kserve)/[\w./-]*[\w])", README))
    paths |= set(re.findall(r"`((?:base|components)/[\w./-]+)`", README))
    assert paths
    for p in paths:
        rel = p.removeprefix("deploy/").removeprefix("../")
        candidates = [DEPLOY_DIR / rel, DEPLOY_DIR / "kubernetes" / rel]
        assert any(c.exists() for c in candidates), f"deploy/README.md names {p}, which does not exist"


def test_apply_commands_target_kustomizations() -> None:
    targets = re.findall(r"kubectl apply -k (\S+)", README)
    assert {"deploy/kubernetes/overlays/cpu", "deploy/kserve"} <= set(targets)
    for t in targets:
        assert (REPO_ROOT / t / "kustomization.yaml").exists(), t


def test_first_request_matches_the_bundled_model() -> None:
    config = (REPO_ROOT / "model_repository" / "ultraface_tnn" / "config.pbtxt").read_text()
    assert re.search(r'name: "input".*dims: \[ 3, 240, 320 \]', config)
    assert re.search(r'name: "scores".*dims: \[ 4420, 2, 1 \]', config)
    assert '"name": "input", "shape": [1, 3, 240, 320]' in README
    assert "(1, 4420, 2, 1)" in README


def test_sizing_claims_match_the_manifests(rendered: dict) -> None:
    hpa = one(rendered["cpu"], "HorizontalPodAutoscaler")["spec"]
    pdb = one(rendered["cpu"], "PodDisruptionBudget")["spec"]
    assert hpa["minReplicas"] >= 2 and pdb["maxUnavailable"] == 1, "a drain must never empty the Service"
    cpus = container(one(rendered["cpu"], "Deployment"))["resources"]["requests"]["cpu"]
    counts = [int(c) for c in re.findall(r"instance_group \[ \{ count: (\d+)", "".join(
        p.read_text() for p in (REPO_ROOT / "model_repository").glob("*/config.pbtxt")))]
    assert counts and int(cpus) == max(counts), "one CPU per instance of the busiest bundled model"
    targets = {m["pods"]["metric"]["name"]: m["pods"]["target"]["averageValue"] for m in hpa["metrics"]}
    claim = (f"queue-to-compute ratio `{targets['nnserve_queue_compute_ratio']}` and "
             f"{targets['nnserve_pending_requests']} pending requests, {hpa['minReplicas']} to {hpa['maxReplicas']}")
    assert claim in " ".join(README.split())
    grace = one(rendered["cpu"], "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert f"terminationGracePeriodSeconds: {grace}" in README
