"""mypy (strict) checks the engine seam and the scheduler: engine.Model and engine.Instance must implement
server/backend.py's protocols, a structural match that nothing checks at run time; so must the Python backend's
PythonModel and PythonInstance (which also takes requests one by one and holds a process to close)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFORMANCE = """
import engine
from server.backend import BackendInstance, BackendModel, ClosableInstance, RequestsInstance
from server.python_backend.model import PythonInstance, PythonModel


def as_model(model: engine.Model) -> BackendModel:
    return model


def as_instance(instance: engine.Instance) -> BackendInstance:
    return instance


def python_as_model(model: PythonModel) -> BackendModel:
    return model


def python_as_instance(instance: PythonInstance) -> RequestsInstance:
    return instance


def python_as_closable(instance: PythonInstance) -> ClosableInstance:
    return instance
"""


def test_the_engine_implements_the_seam_and_the_scheduler_type_checks(tmp_path):
    (tmp_path / "seam_conformance.py").write_text(CONFORMANCE)
    proc = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                           "--ignore-missing-imports", "--cache-dir", str(tmp_path / "cache"),
                           str(tmp_path / "seam_conformance.py"), "server/backend.py", "server/scheduling"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
