"""engine.ops is meaning only: importing it, and every module under it, loads numpy and the engine's IR and errors,
nothing else (no numba, no oneDNN, no threadpoolctl, no device, pass or runtime code). Checked in a fresh
interpreter, where sys.modules shows exactly what an import pulled in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
CODE = """
import importlib, json, pkgutil, sys
before = set(sys.modules)  # the interpreter's own start-up (site hooks)
import engine.ops
for m in pkgutil.iter_modules(engine.ops.__path__):
    importlib.import_module(f"engine.ops.{m.name}")
print(json.dumps(sorted(set(sys.modules) - before)))
"""
ENGINE_ALLOWED = ("engine", "engine.errors", "engine.ir", "engine.ops")


def test_importing_every_op_module_loads_numpy_and_the_ir_only():
    out = subprocess.run([sys.executable, "-c", CODE], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                         check=True)
    modules = json.loads(out.stdout)
    third_party = {m.split(".")[0] for m in modules} - set(sys.stdlib_module_names) - {"engine", "numpy"}
    assert not third_party, f"engine.ops loaded {sorted(third_party)}"
    engine = [m for m in modules if m.split(".")[0] == "engine"]
    outside = [m for m in engine if not any(m == a or m.startswith(a + ".") for a in ENGINE_ALLOWED)]
    assert not outside, f"engine.ops loaded {outside}"
    assert "engine.ops.activation" in engine and "engine.ops.registry" in engine  # the check saw the modules
