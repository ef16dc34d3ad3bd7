"""Soak: perf_analyzer load over HTTP and gRPC for a while, loading and unloading another model every few seconds.

    .venv/bin/python bench/soak.py --duration 600 --concurrency 16

Starts `nnserve serve` (explicit model control) on a temporary copy of the tiny test model, runs perf_analyzer
(tools/perf_analyzer.sh) back to back on both protocols until the duration is over, and meanwhile loads/unloads a
second model. Reports the failed requests (server metrics by reason, and perf_analyzer runs that failed),
excluding intended overload rejections ("Exceeds maximum queue size"; this soak's model has no queue limit, so
there should be none), and the server's RSS after warm-up vs at the end. Exit status 0 when there were no
failures and RSS grew by at most --rss-tolerance.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from server.settings import parse_listening

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "server" / "fixtures" / "affine"
PERF = ROOT / "tools" / "perf_analyzer.sh"
FAILURE_RE = re.compile(r'nv_inference_request_failure\{model="([^"]+)",reason="([^"]+)",version="[^"]*"\} ([\d.e+]+)')
SUCCESS_RE = re.compile(r'nv_inference_request_success\{model="([^"]+)",version="[^"]*"\} ([\d.e+]+)')
CONFIG = """
name: "{name}"
backend: "pnnx"
max_batch_size: 8
input [ {{ name: "in0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "out0" data_type: TYPE_FP32 dims: [ 3 ] }}, {{ name: "out1" data_type: TYPE_FP32 dims: [ 3 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
"""


@dataclass
class SoakReport:
    duration_s: float = 0.0
    concurrency: int = 0
    perf_runs: dict[str, int] = field(default_factory=dict)
    perf_failed_runs: list[str] = field(default_factory=list)
    client_requests: dict[str, int] = field(default_factory=dict)
    server_success: float = 0.0
    server_failures: dict[str, float] = field(default_factory=dict)
    overload_rejections: int = 0
    control_cycles: int = 0
    control_errors: list[str] = field(default_factory=list)
    rss_warm_mib: float = 0.0
    rss_end_mib: float = 0.0

    @property
    def failed_requests(self) -> float:
        return sum(self.server_failures.values()) - self.overload_rejections

    @property
    def rss_growth(self) -> float:
        return (self.rss_end_mib - self.rss_warm_mib) / self.rss_warm_mib if self.rss_warm_mib else 0.0

    def ok(self, tolerance: float) -> bool:
        return (self.failed_requests == 0 and not self.perf_failed_runs and not self.control_errors
                and self.rss_growth <= tolerance)


def make_repository(root: Path) -> Path:
    for name in ("soak", "churn"):
        shutil.copytree(FIXTURE, root / name)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    return root


class Server:
    def __init__(self, repo: Path):
        cmd = [sys.executable, "-m", "server.cli", "serve", "--model-repository", str(repo), "--http-port", "0",
               "--grpc-port", "0", "--metrics-port", "0", "--http-address", "127.0.0.1", "--grpc-address",
               "127.0.0.1", "--model-control-mode", "explicit", "--load-model", "soak", "--load-model", "churn"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.ports: dict[str, int] = {}
        self.log: list[str] = []
        found = threading.Event()

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log.append(line)
                ports = parse_listening(line)
                if ports:
                    self.ports = ports
                    found.set()
            found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(60) or not self.ports:
            raise RuntimeError("server did not start:\n" + "".join(self.log))
        self.http = f"127.0.0.1:{self.ports['http']}"
        self.grpc = f"127.0.0.1:{self.ports['grpc']}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(f"http://{self.http}/v2/health/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("server not ready:\n" + "".join(self.log))

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.ports['metrics']}/metrics", timeout=10).text

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def perf_loop(protocol: str, url: str, concurrency: int, until: float, report: SoakReport) -> None:
    """perf_analyzer runs of ~5 s windows back to back until `until`; each run's client request count is kept."""
    runs = 0
    while time.monotonic() < until - 5:
        args = [str(PERF), "-m", "soak", "-i", protocol, "-u", url, "-b", "1", "--concurrency-range",
                str(concurrency), "--measurement-mode", "time_windows", "-p", "4000", "--max-trials", "3",
                "-s", "1000"]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
        runs += 1
        m = re.search(r"Client:\s*\n\s*Request count: (\d+)", proc.stdout)
        report.client_requests[protocol] = report.client_requests.get(protocol, 0) + (int(m.group(1)) if m else 0)
        if proc.returncode != 0:
            report.perf_failed_runs.append(f"{protocol}: {(proc.stdout + proc.stderr)[-400:]}")
    report.perf_runs[protocol] = runs


def churn_loop(server: Server, until: float, period: float, report: SoakReport) -> None:
    """Unload and load the second model every `period` seconds."""
    base = f"http://{server.http}/v2/repository/models/churn"
    while time.monotonic() < until:
        for action in ("unload", "load"):
            r = httpx.post(f"{base}/{action}", timeout=60)
            if r.status_code != 200:
                report.control_errors.append(f"{action}: {r.status_code} {r.text[:200]}")
            time.sleep(period / 2)
        report.control_cycles += 1


def read_counters(text: str, report: SoakReport) -> None:
    report.server_failures = {}
    for model, reason, value in FAILURE_RE.findall(text):
        if float(value):
            report.server_failures[f"{model}/{reason}"] = float(value)
    report.server_success = sum(float(v) for m, v in SUCCESS_RE.findall(text) if m == "soak")


def soak(duration: float, concurrency: int, churn_period: float = 3.0, warmup: float | None = None) -> SoakReport:
    report = SoakReport(duration_s=duration, concurrency=concurrency)
    warmup = min(60.0, duration * 0.2) if warmup is None else warmup
    with tempfile.TemporaryDirectory(prefix="nnserve-soak-") as tmp:
        server = Server(make_repository(Path(tmp)))
        try:
            start = time.monotonic()
            until = start + duration
            workers = [threading.Thread(target=perf_loop, args=(p, u, concurrency, until, report))
                       for p, u in (("http", server.http), ("grpc", server.grpc))]
            workers.append(threading.Thread(target=churn_loop, args=(server, until, churn_period, report)))
            for w in workers:
                w.start()
            time.sleep(warmup)
            report.rss_warm_mib = server.rss_mib()
            for w in workers:
                w.join()
            report.rss_end_mib = server.rss_mib()
            text = server.metrics()
            read_counters(text, report)
            # the queue of this soak's model is unbounded: any REJECTED would be a real failure, not overload
            report.overload_rejections = 0
        finally:
            code = server.stop()
            if code != 0:
                report.control_errors.append(f"server exited with {code}")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=600, help="seconds of load")
    ap.add_argument("--concurrency", type=int, default=16, help="perf_analyzer concurrency per protocol")
    ap.add_argument("--churn-period", type=float, default=3.0, help="seconds per unload+load cycle")
    ap.add_argument("--rss-tolerance", type=float, default=0.05)
    args = ap.parse_args(argv)
    report = soak(args.duration, args.concurrency, args.churn_period)
    out = {k: getattr(report, k) for k in report.__dataclass_fields__}
    out |= {"failed_requests": report.failed_requests, "rss_growth_pct": round(100 * report.rss_growth, 2)}
    print(json.dumps(out, indent=2))
    return 0 if report.ok(args.rss_tolerance) else 1


if __name__ == "__main__":
    sys.exit(main())
