"""Shared test helpers: where the repository and ../shared are, and how to read a committed model fixture."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES_DIR = REPO_ROOT / "tests" / "fixtures"

# The suite runs on shared, loaded machines. OpenMP's threads sleep at once here (set before any test loads libgomp,
# and inherited by the servers tests start): spinning at barriers on an oversubscribed host costs whole time
# slices. The engine's default wait policy (NNSERVE_SPIN_US) is tested in a process of its own,
# tests/engine/runtime/test_threads.py.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@dataclass
class ModelFixture:
    """One tests/fixtures/<kind>/<name>/ folder: model files, inputs, expected outputs and meta.json."""

    name: str
    path: Path
    meta: dict
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    cases: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = field(default_factory=list)

    @property
    def param(self) -> Path:
        return self.path / "model.pnnx.param"

    @property
    def max_shapes(self) -> dict[str, tuple[int, ...]] | None:
        shapes = self.meta.get("max_shapes")
        return {k: tuple(v) for k, v in shapes.items()} if shapes else None


def _npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def read_fixture(name: str, kind: str = "pnnx") -> ModelFixture:
    path = FIXTURES_DIR / kind / name
    meta = json.loads((path / "meta.json").read_text())
    cases = [
        (_npz(path / f"inputs_{k}.npz"), _npz(path / f"expected_{k}.npz")) for k in range(len(meta.get("cases", [])))
    ]
    return ModelFixture(name, path, meta, _npz(path / "inputs.npz"), _npz(path / "expected.npz"), cases)


def fixture_names(kind: str = "pnnx") -> list[str]:
    """Every fixture folder of one kind (a folder counts once it has its meta.json)."""
    base = FIXTURES_DIR / kind
    return sorted(p.name for p in base.iterdir() if (p / "meta.json").exists()) if base.is_dir() else []


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The read-only ../shared reference folder next to the repository; skips the test when it is absent."""
    path = REPO_ROOT.parent / "shared"
    if not path.is_dir():
        pytest.skip("../shared (reference models and docs) is not present next to the repository")
    return path


@pytest.fixture(scope="session")
def load_fixture() -> Callable[..., ModelFixture]:
    """`load_fixture(name, kind="pnnx")` -> ModelFixture."""
    return read_fixture
