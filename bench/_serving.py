"""Shared parts of the serving benches: temporary model repositories, server processes, perf_analyzer runs."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from server.settings import parse_listening

ROOT = Path(__file__).resolve().parents[1]
PERF = ROOT / "tools" / "perf_analyzer.sh"
RESNET_DYN = ROOT / "bench" / "models" / "resnet18" / "dyn"

# The identity-like model, written by hand: one ReLU over a [batch, 16] FP32 tensor (no weights).
IDENTITY_PARAM = """7767517
3 2
pnnx.Input               pnnx_input_0             0 1 0 #0=(?,16)f32
nn.ReLU                  act                      1 1 0 1 #0=(?,16)f32 #1=(?,16)f32
pnnx.Output              pnnx_output_0            1 0 1 #1=(?,16)f32
"""
IDENTITY_CONFIG = """name: "identity"
backend: "pnnx"
max_batch_size: 8
input [ { name: "in0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "out0" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""
RESNET_CONFIG = """name: "{name}"
backend: "pnnx"
max_batch_size: 8
input [ {{ name: "in0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] }} ]
output [ {{ name: "out0" data_type: TYPE_FP32 dims: [ 1000 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
{batching}"""
DYNAMIC_BATCHING = "dynamic_batching { max_queue_delay_microseconds: %d }\n"
ADAPTIVE_WAIT = 'parameters { key: "dynamic_batching_wait" value { string_value: "adaptive" } }\n'


def write_identity(repo: Path) -> None:
    version = repo / "identity" / "1"
    version.mkdir(parents=True)
    (version / "model.pnnx.param").write_text(IDENTITY_PARAM)
    with zipfile.ZipFile(version / "model.pnnx.bin", "w"):
        pass  # no weights: an empty archive
    (repo / "identity" / "config.pbtxt").write_text(IDENTITY_CONFIG)


def write_resnet(repo: Path, name: str, batching: bool, count: int = 1, delay_us: int = 2000,
                 adaptive: bool = False) -> None:
    """ResNet-18 exported with a dynamic batch (bench/_peers.py dynamic_exports) under `name`; `adaptive` sets
    the batcher's adaptive wait (model_repository/README.md, `dynamic_batching_wait`)."""
    if not (RESNET_DYN / "model.pnnx.param").exists():
        raise SystemExit(f"{RESNET_DYN.relative_to(ROOT)} is missing: run `.venv-dev/bin/python -c \"import sys; "
                         "sys.path.insert(0, 'bench'); import _peers; _peers.dynamic_exports('resnet18')\"`")
    version = repo / name / "1"
    version.mkdir(parents=True)
    for suffix in ("pnnx.param", "pnnx.bin"):
        _link_or_copy(RESNET_DYN / f"model.{suffix}", version / f"model.{suffix}")
    batching_text = (DYNAMIC_BATCHING % delay_us + (ADAPTIVE_WAIT if adaptive else "")) if batching else ""
    config = RESNET_CONFIG.format(name=name, count=count, batching=batching_text)
    (repo / name / "config.pbtxt").write_text(config)


def _link_or_copy(src: Path, dst: Path) -> None:
    # The server refuses symlinks that leave the repository; a hard link costs nothing and is allowed.
    try:
        dst.hardlink_to(src)
    except OSError:
        shutil.copyfile(src, dst)


class Process:
    """A server subprocess with its stderr collected; stop() sends SIGTERM, then kills."""

    def __init__(self, cmd: list[str], ready_url_of, wait_s: float = 300, cwd: Path = ROOT):
        self.proc = subprocess.Popen(cmd, cwd=cwd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.log: list[str] = []
        self.ports: dict[str, int] = {}
        self._ports_seen = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        self._wait_ready(ready_url_of, wait_s)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            ports = parse_listening(line)
            if ports:
                self.ports = ports
                self._ports_seen.set()
        self._ports_seen.set()

    def _wait_ready(self, ready_url_of, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            url = ready_url_of(self)
            if url:
                try:
                    with urllib.request.urlopen(url, timeout=2) as r:
                        if r.status == 200:
                            return
                except OSError:
                    pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"server {self.proc.args[:3]} not ready:\n" + "".join(self.log[-40:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_nnserve(repo: Path, python: str = sys.executable, tree: Path = ROOT) -> tuple[Process, str, str]:
    """nnserve (from source `tree`) on ephemeral loopback ports; returns the process, HTTP host:port and gRPC
    host:port."""
    cmd = [python, "-m", "server.cli", "serve", "--model-repository", str(repo), "--http-port", "0",
           "--grpc-port", "0", "--metrics-port", "0", "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1"]
    proc = Process(cmd, lambda p: p.ports and f"http://127.0.0.1:{p.ports['http']}/v2/health/ready", cwd=tree)
    return proc, f"127.0.0.1:{proc.ports['http']}", f"127.0.0.1:{proc.ports['grpc']}"


@dataclass
class PerfResult:
    throughput: float = 0.0  # infer/s
    p50_us: float = 0.0
    p99_us: float = 0.0
    error: str = ""
    server_cpu_us: float = 0.0  # the server process's CPU (user + sys) per request, when its pid was given

    def cell(self) -> str:
        if self.error:
            return "failed"
        return f"{self.throughput:.0f}" if self.throughput >= 100 else f"{self.throughput:.2f}"


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def perf(model: str, protocol: str, url: str, concurrency: int, window_ms: int = 3000,
         input_data: str = "zero", server_pid: int | None = None) -> PerfResult:
    """One perf_analyzer run at one concurrency (sync requests, batch 1, random input). With `server_pid`, also the
    server's CPU per request: its CPU share over the run divided by the measured rate (every window of a run runs
    at about the same rate)."""
    if server_pid is not None:
        cpu0, t0 = process_cpu_s(server_pid), time.monotonic()
    result = _perf(model, protocol, url, concurrency, window_ms, input_data)
    if server_pid is not None and result.throughput:
        share = (process_cpu_s(server_pid) - cpu0) / (time.monotonic() - t0)
        result.server_cpu_us = share / result.throughput * 1e6
    return result


def _perf(model: str, protocol: str, url: str, concurrency: int, window_ms: int, input_data: str) -> PerfResult:
    out = Path(f"/tmp/nnserve-bench-perf-{model}-{protocol}-{concurrency}-{time.monotonic_ns()}.csv")
    args = [str(PERF), "-m", model, "-i", protocol, "-u", url, "-b", "1",
            "--concurrency-range", f"{concurrency}:{concurrency}", "-p", str(window_ms),
            # The machine is shared: any three windows count as stable, the last one is reported.
            "--max-trials", "3", "-s", "1000", "-f", str(out), "--input-data", input_data]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    try:
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
            return PerfResult(error=" / ".join(tail) or f"exit {proc.returncode}")
        row = next(csv.DictReader(io.StringIO(out.read_text())))
        return PerfResult(float(row["Inferences/Second"]), float(row["p50 latency"]), float(row["p99 latency"]))
    finally:
        out.unlink(missing_ok=True)


def perf_input_file(x: np.ndarray, path: Path) -> Path:
    """perf_analyzer --input-data JSON holding one real input (random bytes could be NaN/denormal floats)."""
    path.write_text(json.dumps({"data": [{"in0": x.astype(np.float32).ravel().tolist()}]}))
    return path


def counters(metrics_url: str, model: str) -> tuple[float, float]:
    """(nv_inference_count, nv_inference_exec_count) of `model`: their deltas give the mean batch size."""
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    values = {}
    for name in ("nv_inference_count", "nv_inference_exec_count"):
        m = re.search(rf'^{name}\{{[^}}]*model="{re.escape(model)}"[^}}]*\}} ([\d.e+]+)$', text, re.M)
        values[name] = float(m.group(1)) if m else 0.0
    return values["nv_inference_count"], values["nv_inference_exec_count"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_kserve(python: str, models: list[str]) -> tuple[Process, str, str]:
    """bench/_kserve_server.py under `python` (a venv with kserve); models as name=path.onnx:dims."""
    http, grpc_port = free_port(), free_port()
    cmd = [python, str(ROOT / "bench" / "_kserve_server.py"), "--http-port", str(http), "--grpc-port",
           str(grpc_port), *models]
    proc = Process(cmd, lambda p: f"http://127.0.0.1:{http}/v2/health/ready")
    return proc, f"127.0.0.1:{http}", f"127.0.0.1:{grpc_port}"


def loopback_rtt_us(n: int = 2000) -> float:
    """Median round trip of a 64-byte message over a loopback TCP connection (the network part of latency)."""
    server = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(64):
                conn.sendall(data)

    threading.Thread(target=echo, daemon=True).start()
    times = []
    with socket.create_connection(server.getsockname()) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            t = time.perf_counter()
            c.sendall(b"x" * 64)
            got = 0
            while got < 64:
                got += len(c.recv(64))
            times.append(time.perf_counter() - t)
    server.close()
    return float(np.median(times) * 1e6)
