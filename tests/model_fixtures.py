"""A committed model fixture (tests/fixtures/<kind>/<name>/): its files, inputs, expected outputs and meta.json.

A module of its own (not conftest.py) so that tests import it by a name no other folder's conftest shadows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES_DIR = REPO_ROOT / "tests" / "fixtures"


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
