"""Fixtures of the deploy tests: kubectl and every rendered kustomization, rendered once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from kube import KUBE_DIR, OVERLAYS, find_kubectl, kustomize


@pytest.fixture(scope="session")
def kubectl() -> str:
    return find_kubectl()


@pytest.fixture(scope="session")
def rendered(kubectl: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """name -> objects for: each overlay, the cpu overlay with the model-pvc component, and deploy/kserve."""
    out = {name: kustomize(kubectl, KUBE_DIR / "overlays" / name) for name in OVERLAYS}
    out["cpu+model-pvc"] = kustomize(kubectl, _pvc_variant(tmp_path_factory.mktemp("pvc")))
    out["kserve"] = kustomize(kubectl, KUBE_DIR.parent / "kserve")
    return out


def _pvc_variant(tmp: Path) -> Path:
    """The documented way to use components/model-pvc: an overlay listing it under `components:`.

    kustomize only takes relative paths, so the scratch kustomization points back into the repository by one.
    """
    rel = Path(*[".."] * len(tmp.resolve().parts[1:]))  # from tmp up to /
    overlay = rel / KUBE_DIR.relative_to("/") / "overlays" / "cpu"
    component = rel / KUBE_DIR.relative_to("/") / "components" / "model-pvc"
    (tmp / "kustomization.yaml").write_text(
        f"namespace: nnserve\nresources: [{overlay.as_posix()}]\ncomponents: [{component.as_posix()}]\n")
    return tmp
