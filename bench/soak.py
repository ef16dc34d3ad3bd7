"""Soak: perf_analyzer load over HTTP and gRPC for a while, loading and unloading another model every few seconds,
with hostile clients on both protocols at the same time.

    .venv/bin/python bench/soak.py --duration 600 --concurrency 16

Starts `nnserve serve` (explicit model control) on a temporary copy of the tiny test model, runs perf_analyzer
(tools/perf_analyzer.sh) back to back on both protocols until the duration is over, and meanwhile loads/unloads a
second model and sends hostile requests to the same model (malformed, lying about their size, oversized, nested,
badly named, half-sent; HOSTILE below), each of which must get its 4xx. Reports the good requests lost (perf_analyzer
runs that failed, and server failures of any reason but REJECTED, which is what hostile requests get), the hostile
requests and any that got another answer, and the server's RSS after warm-up vs at the end. Exit status 0 when no
good request was lost, every hostile request got its 4xx, and RSS moved by at most --rss-tolerance either way.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import numpy as np

from server.protocol.grpc import pb2
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
    hostile_sent: dict[str, int] = field(default_factory=dict)
    hostile_unexpected: list[str] = field(default_factory=list)
    rss_warm_mib: float = 0.0
    rss_end_mib: float = 0.0

    @property
    def failed_requests(self) -> float:
        """Good requests lost: server failures of any reason but REJECTED (what the hostile requests get, and
        what a full queue would give: this soak's model has none)."""
        return sum(v for k, v in self.server_failures.items() if not k.endswith("/REJECTED")) - self.overload_rejections

    @property
    def rss_growth(self) -> float:
        return (self.rss_end_mib - self.rss_warm_mib) / self.rss_warm_mib if self.rss_warm_mib else 0.0

    def ok(self, tolerance: float) -> bool:
        return (self.failed_requests == 0 and not self.perf_failed_runs and not self.control_errors
                and not self.hostile_unexpected and abs(self.rss_growth) <= tolerance)


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


def _rest(body: bytes, path: str = "/v2/models/soak/infer", **headers: str) -> tuple[str, str, bytes, dict]:
    return ("http", path, body, headers)


def _grpc(req: pb2.ModelInferRequest) -> tuple[str, str, bytes, dict]:
    return ("grpc", "", req.SerializeToString(), {})


def _grpc_infer(shape: list[int], datatype: str = "FP32", raw: bytes = b"", name: str = "in0",
                model: str = "soak") -> pb2.ModelInferRequest:
    req = pb2.ModelInferRequest(model_name=model)
    req.inputs.add(name=name, datatype=datatype, shape=shape)
    req.raw_input_contents.append(raw)
    return req


def _json_infer(shape: list, datatype: str = "FP32", data: list | None = None) -> bytes:
    return json.dumps({"inputs": [{"name": "in0", "shape": shape, "datatype": datatype,
                                   "data": [1] if data is None else data}]}).encode()


# Before each RSS sample: long enough for the requests in flight to finish and the server's heap trim to run.
SETTLE_SECS = 2.5
_BYTES_HEAD = json.dumps({"inputs": [{"name": "in0", "shape": [2**28], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": 4}}]}).encode()
# name -> (protocol, path, bytes, headers): each must get a 4xx (HTTP) / a non-OK status other than INTERNAL,
# UNKNOWN and UNAVAILABLE (gRPC).
HOSTILE = {
    "bytes_claiming_2^28": _rest(_BYTES_HEAD + b"\x01\x00\x00\x00",
                                 **{"Inference-Header-Content-Length": str(len(_BYTES_HEAD))}),
    "json_shape_100000_dims": _rest(_json_infer([1] * 100_000)),
    "json_int64_10e400": _rest(_json_infer([1], "INT64", [10**400])),
    "json_nested": _rest(b'{"inputs":' + b"[" * 50_000 + b"]" * 50_000 + b"}"),
    "json_not_utf8": _rest(b'{"inputs":[{"name":"\xff\xfe"}]}'),
    "json_duplicate_inputs": _rest(json.dumps({"inputs": [{"name": "in0", "shape": [1, 4], "datatype": "FP32",
                                                          "data": [1, 2, 3, 4]}] * 2}).encode()),
    "json_wrong_count": _rest(_json_infer([4, 4], data=[1.0] * 15)),
    "index_nested": _rest(b'{"ready":' + b"[" * 50_000 + b"]" * 50_000 + b"}", "/v2/repository/index"),
    "index_over_limit": _rest(b" " * (2 * 2**20), "/v2/repository/index"),
    "long_model_name": _rest(_json_infer([1, 4], data=[1, 2, 3, 4]), "/v2/models/" + "m" * 4000 + "/infer"),
    "unknown_model": _rest(_json_infer([1, 4], data=[1, 2, 3, 4]), "/v2/models/nope/infer"),
    "grpc_bytes_claiming_2^63-1": _grpc(_grpc_infer([2**63 - 1], "BYTES", b"\0\0\0\0")),
    "grpc_shape_lies": _grpc(_grpc_infer([8, 4], raw=b"\0" * 12)),
    "grpc_long_model_name": _grpc(_grpc_infer([1, 4], raw=b"\0" * 16, model="m" * 100_000)),
    "grpc_bytes_lying_length": _grpc(_grpc_infer([1, 1], "BYTES", struct.pack("<I", 1000) + b"abc")),
    "grpc_malformed": ("grpc", "", b"\x0a\xff\xff\xff\xff\x0f", {}),
    "grpc_over_batch_4MiB": _grpc(_grpc_infer([2**18, 4], raw=np.zeros(2**20, np.float32).tobytes())),
}


def hostile_loop(server: Server, until: float, report: SoakReport, pause: threading.Event) -> None:
    """The HOSTILE requests in turn, plus now and then a half-sent request left open, until `until`; none while
    `pause` is set (RSS is measured then, not in the middle of a hostile request's transient allocations)."""
    options = [("grpc.max_send_message_length", 64 * 2**20)]
    with httpx.Client(timeout=60) as http, grpc.insecure_channel(server.grpc, options=options) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        half_sent: list[socket.socket] = []
        while time.monotonic() < until:
            for name, (protocol, path, body, headers) in HOSTILE.items():
                while pause.is_set() and time.monotonic() < until:
                    time.sleep(0.1)
                report.hostile_sent[name] = report.hostile_sent.get(name, 0) + 1
                try:
                    if protocol == "http":
                        status = http.post(f"http://{server.http}{path}", content=body, headers=headers).status_code
                        ok = 400 <= status < 500
                    else:
                        try:
                            infer(body, timeout=60)
                            status, ok = "OK", False
                        except grpc.RpcError as err:
                            status = err.code().name
                            ok = err.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
                                                    grpc.StatusCode.UNAVAILABLE)
                except Exception as exc:  # noqa: BLE001 - a hostile request that breaks the client is a finding too
                    status, ok = f"{type(exc).__name__}: {exc}", False
                if not ok:
                    report.hostile_unexpected.append(f"{name}: {status}")
                time.sleep(0.05)
            sock = socket.create_connection(("127.0.0.1", server.ports["http"]))
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            half_sent.append(sock)
            report.hostile_sent["half_sent_request"] = report.hostile_sent.get("half_sent_request", 0) + 1
            for old in half_sent[:-20]:  # at most 20 held; the server's header timeout closes them earlier
                old.close()
            del half_sent[:-20]
        for sock in half_sent:
            sock.close()


def read_counters(text: str, report: SoakReport) -> None:
    report.server_failures = {}
    for model, reason, value in FAILURE_RE.findall(text):
        if float(value):
            report.server_failures[f"{model}/{reason}"] = float(value)
    report.server_success = sum(float(v) for m, v in SUCCESS_RE.findall(text) if m == "soak")


def soak(duration: float, concurrency: int, churn_period: float = 3.0, warmup: float | None = None,
         hostile: bool = True) -> SoakReport:
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
            pause = threading.Event()
            if hostile:
                workers.append(threading.Thread(target=hostile_loop, args=(server, until, report, pause)))
            for w in workers:
                w.start()
            time.sleep(warmup)
            # RSS with the good traffic running and the hostile one paused for a moment, at warm-up and at the end
            pause.set()
            time.sleep(SETTLE_SECS)
            report.rss_warm_mib = server.rss_mib()
            pause.clear()
            for w in workers:
                w.join()
            time.sleep(SETTLE_SECS)
            report.rss_end_mib = server.rss_mib()
            text = server.metrics()
            read_counters(text, report)
            # the queue of this soak's model is unbounded: no overload rejection (REJECTED: the hostile requests)
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
    ap.add_argument("--no-hostile", action="store_true", help="good traffic only")
    args = ap.parse_args(argv)
    report = soak(args.duration, args.concurrency, args.churn_period, hostile=not args.no_hostile)
    out = {k: getattr(report, k) for k in report.__dataclass_fields__}
    out |= {"failed_requests": report.failed_requests, "rss_growth_pct": round(100 * report.rss_growth, 2),
            "hostile_total": sum(report.hostile_sent.values())}
    print(json.dumps(out, indent=2))
    return 0 if report.ok(args.rss_tolerance) else 1


if __name__ == "__main__":
    sys.exit(main())
