"""The image's install path works: the wheel the builder stage makes carries the generated gRPC stubs and their
stamp, so the installed server starts without protoc, without proto/ and without writing into site-packages
(the root filesystem is read-only in the pod)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from imagebuild import site_env

pytestmark = pytest.mark.slow

GEN = "server/protocol/grpc/_gen/"


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if "__pycache__" not in p.parts}


def test_wheel_carries_the_generated_stubs(image_install) -> None:
    names = set(zipfile.ZipFile(image_install.wheel).namelist())
    for stub in ("grpc_service_pb2.py", "grpc_service_pb2_grpc.py", "health_pb2.py", "health_pb2_grpc.py"):
        assert GEN + stub in names, f"{stub} missing from the wheel"
    assert "server/model_config/model_config_pb2.py" in names
    assert "server/cli.py" in names and "engine/__init__.py" in names
    assert not any(n.startswith(("tests/", "proto/")) for n in names)


def test_installed_server_imports_without_generating_anything(image_install, tmp_path: Path) -> None:
    before = _files(image_install.site)
    code = ("import server, engine, server.protocol.grpc as g, server.app; "
            "print(server.__file__); print(g.pb2.__file__)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=site_env(image_install.site, NUMBA_CACHE_DIR=str(tmp_path / "numba")))
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.split():
        assert Path(line).is_relative_to(image_install.site), f"{line} imported from outside the install"
    assert _files(image_install.site) == before, "importing the installed server wrote into site-packages"
