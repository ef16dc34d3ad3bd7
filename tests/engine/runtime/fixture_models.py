"""The committed PNNX fixture models (tests/fixtures/pnnx/<name>/): paths, max shapes, cases."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pnnx"


def fixture_names() -> list[str]:
    return sorted(p.parent.name for p in FIXTURES.glob("*/model.pnnx.param"))


def model_path(name: str) -> Path:
    return FIXTURES / name / "model.pnnx.param"


def meta(name: str) -> dict:
    path = FIXTURES / name / "meta.json"
    return json.loads(path.read_text()) if path.exists() else {}


def max_shapes(name: str) -> dict[str, tuple[int, ...]]:
    m = meta(name)
    if m.get("max_shapes"):
        return {k: tuple(v) for k, v in m["max_shapes"].items()}
    with np.load(FIXTURES / name / "inputs.npz") as z:
        return {k: z[k].shape for k in z.files}


def cases(name: str) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """(inputs, expected) pairs: inputs_<i>.npz / expected_<i>.npz when present, else inputs.npz / expected.npz."""
    folder = FIXTURES / name
    stems = sorted(p.stem.removeprefix("inputs") for p in folder.glob("inputs_*.npz")) or [""]
    out = []
    for s in stems:
        with np.load(folder / f"inputs{s}.npz") as i, np.load(folder / f"expected{s}.npz") as e:
            out.append(({k: i[k] for k in i.files}, {k: e[k] for k in e.files}))
    return out


def assert_close_to_torch(got: dict[str, np.ndarray], want: dict[str, np.ndarray], rel: float = 1e-4) -> None:
    """fp32: max abs error below `rel` of the output's scale (its max magnitude, at least 1e-6)."""
    assert set(got) == set(want), f"outputs {sorted(got)} != expected {sorted(want)}"
    for k, w in want.items():
        g = got[k]
        assert g.shape == w.shape, f"{k}: shape {g.shape} != {w.shape}"
        scale = max(float(np.max(np.abs(w))) if w.size else 0.0, 1e-6)
        err = float(np.max(np.abs(g.astype(np.float64) - w))) if w.size else 0.0
        assert err <= rel * scale, f"{k}: max abs error {err:.3g} above {rel} x scale {scale:.3g}"
