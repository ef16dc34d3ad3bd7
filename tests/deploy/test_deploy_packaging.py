"""What a user installs: `make serve` installs the server extra only and `make test` the test extra (their stamps kept
apart), and a wheel built by `python -m build` from a fresh clone installs into a clean venv and serves the bundled
repository; the sdist and the wheel carry the LICENSE that pyproject names."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from kube import REPO_ROOT
from liveserver import LiveServer

from server import settings

# What `python -m build` reads from a fresh clone (git-ignored state such as generated stubs or caches left out).
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "proto", "engine", "server")
NOT_IN_A_CLONE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")


# ---- make serve / make test ---------------------------------------------------------------------------------------
def make_dry_run(target: str, venv: Path) -> str:
    """The commands `make TARGET` would run for a venv at `venv` (make -n runs nothing)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    proc = subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def install_lines(commands: str) -> list[str]:
    return [ln for ln in commands.splitlines() if "pip install" in ln and "-e" in ln.split()]


def test_make_serve_installs_the_server_extra_only_and_shows_progress(tmp_path: Path) -> None:
    commands = make_dry_run("serve", tmp_path / "venv")
    assert f"-m venv {tmp_path / 'venv'}" in commands
    (line,) = install_lines(commands)
    assert line.endswith("-e '.[server]'")
    assert " -q" not in line, "the long install shows pip's progress"
    assert "== installing nnserve" in commands, "a visible step line says what is being installed"
    assert "nnserve serve --model-repository model_repository" in commands


def test_make_test_after_make_serve_installs_the_test_extra(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / ".installed-server").touch()  # as `make serve` leaves it
    (line,) = install_lines(make_dry_run("test", venv))
    assert "'.[test]'" in line
    assert not install_lines(make_dry_run("serve", venv)), "make serve reuses its own install"
    (venv / ".installed").touch()  # as `make test` leaves it (the test extra includes the server extra)
    assert not install_lines(make_dry_run("test", venv))
    assert not install_lines(make_dry_run("serve", venv))


def test_make_test_installs_promtool_where_it_can(tmp_path: Path) -> None:
    """The rule tests need promtool (Debian's `prometheus` package): installed as root with apt-get, else said."""
    commands = make_dry_run("test", tmp_path / "venv")
    assert "command -v promtool" in commands
    assert "apt-get install" in commands and "--no-install-recommends prometheus" in commands
    assert "the rule tests will skip" in commands


# ---- python -m build ----------------------------------------------------------------------------------------------
@dataclass
class Built:
    sdist: Path
    wheel: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    src = tmp_path_factory.mktemp("clone")
    for name in BUILD_INPUTS:
        path = REPO_ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=NOT_IN_A_CLONE)
        else:
            shutil.copy2(path, src / name)
    out = tmp_path_factory.mktemp("dist")
    # Without isolation: build still checks pyproject's build-system.requires against this venv and fails on any
    # unmet one, without making two throwaway venvs (~25 s here). The isolated build that fetches those requires
    # is the README walk's `make serve` (tests/e2e: pip's editable install of a fresh clone).
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (sdist,) = out.glob("nnserve-*.tar.gz")
    (wheel,) = out.glob("nnserve-*.whl")
    return Built(sdist, wheel)


def test_license_file_matches_pyproject_and_ships_in_sdist_and_wheel(built: Built) -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    text = (REPO_ROOT / "LICENSE").read_bytes()
    assert b"Apache License\n                           Version 2.0, January 2004" in text
    assert b"END OF TERMS AND CONDITIONS" in text and b"APPENDIX: How to apply the Apache License" in text
    with tarfile.open(built.sdist) as sdist:
        member = next(m for m in sdist.getmembers() if m.name.endswith("/LICENSE") and m.name.count("/") == 1)
        assert sdist.extractfile(member).read() == text
    with zipfile.ZipFile(built.wheel) as wheel:
        info = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")).rsplit("/", 1)[0]
        assert wheel.read(f"{info}/licenses/LICENSE") == text
        metadata = wheel.read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata


# The gRPC stubs and the model-config module are committed (tools/gen_protos.py), so a wheel built from a fresh
# clone carries them and the installed server never runs protoc.
@pytest.mark.slow
@pytest.mark.timeout(1200)  # a clean venv downloads (or takes from pip's cache) numpy, numba, grpcio, ...
def test_wheel_installs_into_a_clean_venv_and_serves_the_bundled_repository(built: Built, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # --no-compile: pip byte-compiles every installed file (half the install's time here); the server compiles
    # only what it imports when it starts. What this proves is unchanged: the wheel's metadata resolves its
    # dependencies into an empty venv and the installed console script serves.
    proc = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-compile",
                           f"{built.wheel}[server]"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    probe = "import importlib.util as u; print([m for m in ('pytest', 'ruff', 'numba_cuda') if u.find_spec(m)])"
    assert subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                          timeout=60).stdout.strip() == "[]", "the server extra pulls in test tools"

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(NUMBA_CACHE_DIR=str(tmp_path / "numba"), PYTHONUNBUFFERED="1")
    argv = [str(venv / "bin" / "nnserve"), "serve", "--model-repository", str(REPO_ROOT / "model_repository"),
            "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
    server = LiveServer(argv, env, tmp_path)
    try:
        server.wait_ready()
        inp = {"name": "input", "shape": [1, 3, 240, 320], "datatype": "FP32",
               "data": np.zeros(3 * 240 * 320, np.float32).tolist()}
        reply = httpx.post(server.url("/v2/models/ultraface_tnn/infer"), json={"inputs": [inp]}, timeout=120)
        assert reply.status_code == 200, reply.text
        assert {o["name"]: o["shape"] for o in reply.json()["outputs"]} == {"scores": [1, 4420, 2, 1],
                                                                          "boxes": [1, 4420, 4, 1]}
        assert server.status("/v2/models/ultraface_pnnx/ready") == 200
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}")
        assert client.is_server_ready()
        client.close()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(settings.EXIT_TIMEOUT_SECS + 30) == 0, server.log_text
    finally:
        server.stop()

