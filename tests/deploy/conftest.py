"""Deploy-test fixtures: every kustomization rendered once, and nnserve installed from the wheel the image builds."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from dockerfile import Dockerfile
from imagebuild import build_wheel, copy_context, install_wheel, run_stub_step
from kube import KUBE_DIR, OVERLAYS, REPO_ROOT, find_kubectl, kustomize


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


@dataclass
class ImageInstall:
    wheel: Path
    site: Path


@pytest.fixture(scope="session")
def image_install(tmp_path_factory: pytest.TempPathFactory) -> ImageInstall:
    """nnserve built as the image's builder stage builds it and installed from the wheel alone."""
    df = Dockerfile.parse(REPO_ROOT / "Dockerfile")
    context = tmp_path_factory.mktemp("context")
    copy_context(df, context)
    try:
        run_stub_step(df, context)
        wheel = build_wheel(context)
        site = tmp_path_factory.mktemp("site")
        install_wheel(wheel, site)
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"{exc.cmd} failed:\n{exc.stdout}\n{exc.stderr}")
    return ImageInstall(wheel, site)
