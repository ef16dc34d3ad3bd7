"""Runs the image's entrypoint (from the Dockerfile) as a local process and probes it the way the kubelet does."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import httpx

from server import settings
from server.settings import parse_listening

PROBE_TIMEOUT = 5.0  # the Deployment's livenessProbe timeoutSeconds


class LiveServer:
    """`argv` runs with `env`; ports are ephemeral and read from the server's log line."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path):
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.log: list[str] = []
        self.ports: dict[str, int] = {}
        self._found = threading.Event()
        threading.Thread(target=self._read_log, daemon=True).start()
        self.client = httpx.Client(timeout=PROBE_TIMEOUT)

    def _read_log(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            ports = parse_listening(line)
            if ports:
                self.ports = ports
                self._found.set()

    def wait_listening(self, timeout: float = 120) -> None:
        if not self._found.wait(timeout):
            raise AssertionError("the server never reported its ports:\n" + self.log_text)

    @property
    def log_text(self) -> str:
        return "".join(self.log[-60:])

    def url(self, path: str, port: str = "http") -> str:
        return f"http://127.0.0.1:{self.ports[port]}{path}"

    def status(self, path: str) -> int | None:
        """The HTTP status a kubelet httpGet probe would see; None when nothing answers."""
        try:
            return self.client.get(self.url(path)).status_code
        except httpx.TransportError:
            return None

    def probes(self) -> tuple[int | None, int | None]:
        return self.status(settings.LIVE_PATH), self.status(settings.READY_PATH)

    def wait_ready(self, timeout: float = 600) -> None:
        """Until readiness answers 200 (a cold numba cache compiles every kernel first); fails at once when the
        process exits (the deadline only guards against a hang)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                time.sleep(0.5)  # let the log reader take the last lines
                raise AssertionError(f"the server exited with {self.proc.returncode}:\n{self.log_text}")
            if self.ports and self.probes()[1] == 200:
                return
            time.sleep(0.2)
        raise AssertionError("not ready in time:\n" + self.log_text)

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def sample_until(server: LiveServer, done, timeout: float, interval: float = 0.02) -> list[tuple]:  # noqa: ANN001
    """(live, ready) pairs until done(pair) or the process exits; fails after `timeout` seconds."""
    samples = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pair = server.probes()
        samples.append(pair)
        if done(pair) or server.proc.poll() is not None:
            return samples
        time.sleep(interval)
    raise AssertionError(f"no end after {timeout} s; last probes {samples[-5:]}\n{server.log_text}")
