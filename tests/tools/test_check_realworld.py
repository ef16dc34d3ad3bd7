"""tools/check_realworld.py (what `make realworld` runs) tells the statuses apart and reports them: a model that
matches torch is `ok`, a changed golden is `wrong`, an unknown op is `refused` under that op's name, an export
pnnx could not make is `export failed`; docs/realworld.md's table and groups say so."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tools"))
check_realworld = importlib.import_module("check_realworld")

SOURCE = REPO_ROOT / "tests" / "fixtures" / "realworld" / "repvgg"  # a plain CNN: every op supported


def copy_model(root: Path, name: str) -> Path:
    folder = root / name
    shutil.copytree(SOURCE, folder)
    return folder


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("suite")
    copy_model(root, "good")
    wrong = copy_model(root, "off")
    with np.load(wrong / "expected.npz") as z:
        want = {k: z[k] for k in z.files}
    want["out0"] = want["out0"] + 0.01 * np.abs(want["out0"]).max()  # 1% of the output's scale
    np.savez(wrong / "expected.npz", **want)
    refused = copy_model(root, "unknown_op")
    param = refused / "model.pnnx.param"
    param.write_text(param.read_text().replace("nn.ReLU ", "nn.Bogus", 1))
    failed = copy_model(root, "no_export")
    meta = json.loads((failed / "meta.json").read_text())
    (failed / "meta.json").write_text(json.dumps(meta | {"export_error": "RuntimeError: pnnx exit 1: boom"}))
    return {p.name: check_realworld.check_one(p) for p in sorted(root.iterdir())}


def test_statuses(results: dict[str, dict]) -> None:
    assert results["good"]["status"] == "ok", results["good"]
    assert results["good"]["max_rel"] <= check_realworld.REL_TOL and results["good"]["ms"] > 0
    assert results["off"]["status"] == "wrong" and "max rel error" in results["off"]["error"]
    assert results["unknown_op"]["status"] == "refused"
    assert any("nn.Bogus" in op for op in results["unknown_op"]["ops"]), results["unknown_op"]
    assert results["no_export"] == results["no_export"] | {"status": "export failed",
                                                           "error": "RuntimeError: pnnx exit 1: boom"}


def test_compare_flags_shapes_and_integers() -> None:
    want = {"out0": np.arange(6, dtype=np.int64).reshape(2, 3)}
    assert check_realworld.compare({"out0": want["out0"].copy()}, want)[2] == ""
    assert "values differ" in check_realworld.compare({"out0": want["out0"] + 1}, want)[2]
    assert "shape" in check_realworld.compare({"out0": want["out0"].reshape(3, 2)}, want)[2]
    assert "outputs" in check_realworld.compare({}, want)[2]


def test_report_lists_every_model_and_groups_refusals_by_op(results: dict[str, dict]) -> None:
    metas = {name: json.loads((SOURCE / "meta.json").read_text()) for name in results}
    doc = check_realworld.render(list(results.values()), metas, "python tools/check_realworld.py")
    for name, r in results.items():
        assert f"| {name} | cnn | 1x3x64x64 | {r['status']} |" in doc
    refused_op = results["unknown_op"]["ops"][0]
    assert f"- `{refused_op}` (1): unknown_op (refused)" in doc
    assert "- off: max rel error" in doc
    assert "Summary: 1 export failed, 1 ok, 1 refused, 1 wrong (4 models)." in doc
