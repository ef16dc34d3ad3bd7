"""A new user's first hour: on a fresh clone of this checkout (its committed HEAD), everything README.md and
docs/models.md tell a user to run, run as they say it, with the committed photo and the committed PyTorch export
(docs/smallnet/).

Each command block of the two documents carries a marker (tools/docsteps.py): run here, started here as the server,
run by tools/make_models_example.py (PyTorch and pnnx, which the suite does not install), or not run with the reason
written beside it. The README's `make serve` really installs into the clone's own .venv (from pip's cache where it
has the wheels: ~1 min here; without pip's byte-compiling of every installed file), as a user's first command does;
the servers get ephemeral ports instead of 8000-8002, and the blocks' `localhost:800N` are pointed at those ports. A
step fails the walk when it exits non-zero, does not print what its marker says it prints, or the server logs a
traceback.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from server.settings import parse_listening

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tools"))

import docsteps  # noqa: E402

DOCUMENTS = ("README.md", "docs/models.md")
PORT_FLAGS = ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--http-address", "127.0.0.1",
              "--grpc-address", "127.0.0.1"]
LOCALHOST = {"localhost:8000": "http", "localhost:8001": "grpc", "localhost:8002": "metrics"}


def test_every_command_block_is_run_or_says_why() -> None:
    for name in DOCUMENTS:
        text = (REPO_ROOT / name).read_text()
        assert docsteps.unmarked_blocks(text) == [], f"{name}: blocks without a step marker (tools/docsteps.py)"
        steps = docsteps.steps(text, name)
        assert all(s.why for s in steps if s.who == "none"), f"{name}: a block not run must say why"
        assert [s.who for s in steps].count("server") == 1, f"{name}: one server step, before the steps using it"


class Server:
    """A server command of a document, run with ephemeral ports; the ports come from its log."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str]):
        argv = ["bash", "-c", f'exec {command} "$@"', "server", *PORT_FLAGS]
        self.command = command
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        self.log: list[str] = []
        self.ports: dict[str, int] = {}
        self._found = threading.Event()
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            if parse_listening(line):
                self.ports = parse_listening(line) or {}
                self._found.set()
        self._found.set()

    def wait_ready(self, timeout: float = 600) -> None:
        """Readiness, after the first start in a fresh venv compiled the kernels (numba's cache starts empty)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                time.sleep(0.5)
                raise AssertionError(f"`{self.command}` exited {self.proc.returncode}:\n{self.log_text}")
            if self.ports and self._ready():
                return
            time.sleep(0.3)
        raise AssertionError(f"`{self.command}` not ready after {timeout} s:\n{self.log_text}")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['http']}/v2/health/ready", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def point_at(self, code: str) -> str:
        for address, port in LOCALHOST.items():
            code = code.replace(address, f"127.0.0.1:{self.ports[port]}")
        return code

    @property
    def log_text(self) -> str:
        return "".join(self.log[-80:])

    def stop(self) -> int:
        """SIGTERM, as Ctrl-C or a container stop; the server drains and exits 0."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode


@dataclass
class Walk:
    """One document followed in `cwd`; `python` runs its Python blocks."""

    cwd: Path
    env: dict[str, str]
    python: str
    servers: list[Server] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    def follow(self, document: Path, source: str) -> None:
        for step in docsteps.steps(document.read_text(), source):
            if step.who == "server":
                self.servers.append(self.start(step))
            elif step.who == "walk":
                if self.servers:
                    step = docsteps.Step(**{**step.__dict__, "code": self.servers[-1].point_at(step.code)})
                self.outputs.append(docsteps.run(step, self.cwd, self.env, self.python))

    def start(self, step: docsteps.Step) -> Server:
        (command,) = [ln.split("#")[0].strip() for ln in step.code.splitlines() if ln.split("#")[0].strip()]
        if command == "make serve":  # what make would run: its install steps here, then its serve command
            *install, command = make_commands("serve", self.cwd, self.env)
            run_install(install, self.cwd, self.env, step)
        server = Server(command, self.cwd, self.env)
        try:
            server.wait_ready()
        except AssertionError:
            server.stop()
            raise
        return server

    def stop(self) -> list[str]:
        """Stops the servers; what a user would see go wrong there (a failed exit, a traceback in the log)."""
        problems = []
        for server in self.servers:
            code = server.stop()
            if code != 0:
                problems.append(f"`{server.command}` exited {code} after SIGTERM:\n{server.log_text}")
            if "Traceback" in "".join(server.log):
                problems.append(f"`{server.command}` logged a traceback:\n{server.log_text}")
        return problems


def make_commands(target: str, cwd: Path, env: dict[str, str]) -> list[str]:
    proc = subprocess.run(["make", "-n", "--no-print-directory", target], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()


def run_install(commands: list[str], cwd: Path, env: dict[str, str], step: docsteps.Step) -> None:
    script = "\n".join(commands)
    # PIP_NO_COMPILE: pip byte-compiles every file it installs (numpy, numba, grpc, ...: over half of this install
    # here); the walk's steps then compile only the modules they import, once (user_env keeps byte-code writing on).
    env = {**env, "PIP_NO_COMPILE": "1"}
    proc = subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"{step.where}: `make serve`'s install failed:\n{script}\n{proc.stdout[-3000:]}" \
                                 f"{proc.stderr[-3000:]}"


def user_env(home: Path) -> dict[str, str]:
    """A shell as a user has it: no virtualenv of the suite on PATH or in the environment."""
    suite_bin = str(Path(sys.executable).parent)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != suite_bin]
    # `make test` runs the suite: a user's shell has none of make's variables (MAKELEVEL would make make -n print
    # "Entering directory" lines, as a sub-make does). Nor PYTHONDONTWRITEBYTECODE (set on some CI hosts): the first
    # step writes the byte-code of what it imports and the later steps reuse it.
    drop = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES",
            "PYTHONDONTWRITEBYTECODE"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "PATH": os.pathsep.join(path), "NUMBA_CACHE_DIR": str(home / "numba"), "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`git clone` of this checkout's HEAD (what a user gets: committed files only)."""
    if shutil.which("git") is None or shutil.which("make") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("needs git, make and a git checkout to clone")
    dest = tmp_path_factory.mktemp("walk") / "nnserve"
    proc = subprocess.run(["git", "clone", "--quiet", str(REPO_ROOT), str(dest)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return dest


@dataclass
class Walked:
    walk: Walk
    problems: list[str]


@pytest.fixture(scope="module")
def readme_walk(clone: Path) -> Walked:
    walk = Walk(clone, user_env(clone.parent), str(clone / ".venv" / "bin" / "python"))
    try:
        walk.follow(clone / "README.md", "README.md")
    finally:
        problems = walk.stop()
    return Walked(walk, problems)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_readme(readme_walk: Walked) -> None:
    """make serve, the clients, the example on the photo, the engine on its own, import and convert."""
    assert readme_walk.problems == []
    walk = readme_walk.walk
    (server,) = walk.servers
    assert {"http", "grpc", "metrics"} <= set(server.ports)
    assert (walk.cwd / "faces.png").stat().st_size > 0
    assert (walk.cwd / "my_models" / "smallnet_tnn" / "1" / "model.tnnproto").exists()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_models_guide(readme_walk: Walked, tmp_path: Path) -> None:
    """docs/models.md's nnserve steps on the committed export, in a folder of its own with the venv activated,
    ending in requests whose answers are compared with PyTorch's."""
    root = readme_walk.walk.cwd
    work = tmp_path / "smallnet"
    shutil.copytree(root / "docs" / "smallnet", work)
    venv = root / ".venv"  # activated, as the guide asks
    env = readme_walk.walk.env
    env = {**env, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}"}
    walk = Walk(work, env, str(venv / "bin" / "python"))
    try:
        walk.follow(root / "docs" / "models.md", "docs/models.md")
    finally:
        problems = walk.stop()
    assert problems == []
    assert sorted(p.name for p in (work / "models").iterdir()) == ["smallnet", "smallnet_anysize", "smallnet_auto",
                                                                    "smallnet_tnn"]
