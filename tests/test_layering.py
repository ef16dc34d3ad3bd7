"""The layering contracts of pyproject.toml ([tool.importlinter]) hold, and they name every format and device."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"


def test_import_contracts_kept():
    proc = subprocess.run([sys.executable, "-c", LINT], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def folders(package: str) -> set[str]:
    base = ROOT / Path(*package.split("."))
    return {f"{package}.{p.parent.name}" for p in base.glob("*/__init__.py")}


def independent_modules() -> list[set[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return [set(c["modules"]) for c in config["contracts"] if c["type"] == "independence"]


def test_every_format_and_device_folder_is_under_contract():
    """A new format or device folder joins the independence contract of its kind (so it cannot import a sibling)."""
    contracts = independent_modules()
    for package in ("engine.formats", "engine.devices"):
        assert folders(package) in contracts, f"{sorted(folders(package))}: not one independence contract"
