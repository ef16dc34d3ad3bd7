"""Starts `nnserve serve` as a subprocess on 127.0.0.1 with ephemeral ports and finds the ports in its log."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import httpx
import numpy as np

from server.settings import parse_listening

FIXTURES = Path(__file__).resolve().parent / "fixtures"

AFFINE_CONFIG = """
name: "affine"
backend: "pnnx"
max_batch_size: 8
input [ { name: "in0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "out0" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "out1" data_type: TYPE_FP32 dims: [ 3 ] } ]
dynamic_batching { max_queue_delay_microseconds: 20000 }
instance_group [ { count: 2 kind: KIND_CPU } ]
"""


def affine_reference(x: np.ndarray) -> dict[str, np.ndarray]:
    """numpy reference of the fixture model, from the weights stored in its .pnnx.bin."""
    with zipfile.ZipFile(FIXTURES / "affine" / "1" / "model.pnnx.bin") as z:
        w = np.frombuffer(z.read("fc.weight"), "<f4").reshape(3, 4)
        b = np.frombuffer(z.read("fc.bias"), "<f4")
    h = x.astype(np.float64) @ w.T + b
    return {"out0": np.maximum(h, 0), "out1": 1 / (1 + np.exp(-h))}


def make_repository(root: Path, models: dict[str, str | None]) -> Path:
    """models: name -> config.pbtxt text (None = no config, auto-complete)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, config in models.items():
        shutil.copytree(FIXTURES / "affine", root / name)
        if config is not None:
            (root / name / "config.pbtxt").write_text(config.replace('"affine"', f'"{name}"'))
    return root


def nnserve_command() -> list[str]:
    """The installed `nnserve` console script next to this interpreter (as users run it), else the module."""
    script = Path(sys.executable).parent / "nnserve"
    return [str(script)] if script.exists() else [sys.executable, "-m", "server.cli"]


# Becomes the server after tying it to this process: on Linux it gets SIGTERM when the thread that started it dies
# (prctl PR_SET_PDEATHSIG, which an exec keeps), so a test run killed midway (its process group sent SIGTERM,
# pytest-xdist's workers gone) leaves no server behind; it exits at once when that parent is already gone. With an
# open-file count (argv[2], 0 for none) it sets RLIMIT_NOFILE first, for tests that exhaust descriptors.
# (A shim rather than preexec_fn: see ServerProcess.)
_LAUNCH_THEN_EXEC = (
    "import ctypes, os, resource, signal, sys\n"
    "if sys.platform.startswith('linux'):\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)\n"
    "n = int(sys.argv[2])\n"
    "if n:\n"
    "    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))\n"
    "os.execv(sys.argv[3], sys.argv[3:])\n")


# A test server stops without the drain delay (0.5 s by default, paid at each of the suite's ~85 stops): a test
# of the SIGTERM sequence passes its own --drain-delay-secs, which comes later on the command line and wins.
_FAST_STOP = ("--drain-delay-secs", "0")


class ServerProcess:
    def __init__(self, repository: Path, *extra: str, expect_ready: bool = True, env: dict[str, str] | None = None,
                 open_files: int | None = None):
        """open_files: the server's open-file limit (RLIMIT_NOFILE), for tests that exhaust descriptors."""
        cmd = [*nnserve_command(), "serve", "--model-repository", str(repository),
               "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--http-address", "127.0.0.1",
               "--grpc-address", "127.0.0.1", *_FAST_STOP, *extra]
        cmd = [sys.executable, "-c", _LAUNCH_THEN_EXEC, str(os.getpid()), str(open_files or 0), *cmd]
        # No preexec_fn: it makes subprocess fork() instead of vfork(), and grpcio >= 1.80 (grpc issue 43055)
        # restarts its poller in the forked child, which aborts (epoll_wait: EBADF) once the fds are closed and before
        # exec, whenever this process has used a gRPC channel.
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                     env={**os.environ, **env} if env else None)
        self.log: list[str] = []
        self.ports: dict[str, int] = {}
        self._found = threading.Event()
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self._found.wait(60):
            self.stop()
            raise RuntimeError("server did not report its ports:\n" + self.log_text)
        if expect_ready:
            self.wait_ready()

    def _read_log(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            ports = parse_listening(line)
            if ports:
                self.ports = ports
                self._found.set()
        self._found.set()

    @property
    def log_text(self) -> str:
        return "".join(self.log)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.ports['http']}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['metrics']}/metrics"

    def memory_mib(self, field: str = "VmRSS") -> float:
        """The server's VmRSS (resident now) or VmHWM (peak resident so far), from /proc/<pid>/status."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"no {field} for pid {self.proc.pid}")

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_text}")
            try:
                if httpx.get(f"http://{self.http_url}/v2/health/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server not ready in time:\n" + self.log_text)

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def sample(text: str, name: str, **labels: str) -> float:
    """Value of the first sample line `name{...labels...} value` (a plain reader: sample names stay exact)."""
    for line in text.splitlines():
        m = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    raise AssertionError(f"no sample {name}{labels}")
