"""Triton's perf_analyzer (fetched by tools/perf_analyzer.sh) against nnserve over HTTP and gRPC."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "perf_analyzer.sh"

pytestmark = pytest.mark.slow


def run_perf(args: list[str]) -> str:
    proc = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_reports_throughput_and_server_breakdown(server, protocol):
    url = server.http_url if protocol == "http" else server.grpc_url
    # Count windows and a loose stability bound: the point is that it runs and reports, not a stable number on a
    # shared 2-core machine.
    out = run_perf(["-m", "affine", "-i", protocol, "-u", url, "-b", "1", "--concurrency-range", "4",
                    "--measurement-mode", "count_windows", "--measurement-request-count", "100",
                    "--max-trials", "6", "-s", "100"])
    throughput = float(re.search(r"Throughput: ([\d.]+) infer/sec", out).group(1))
    assert throughput > 10, out
    server_part = out.split("Server:", 1)[1]
    assert int(re.search(r"Inference count: (\d+)", server_part).group(1)) > 0
    m = re.search(r"Avg request latency: (\d+) usec \(overhead (\d+) usec \+ queue (\d+) usec \+ compute input "
                  r"(\d+) usec \+ compute infer (\d+) usec \+ compute output (\d+) usec\)", server_part)
    assert m, out
    assert int(m.group(1)) > 0 and int(m.group(5)) > 0  # server-side latency and compute infer were measured
    # 4 concurrent clients against a 20 ms queue delay: the batcher merged requests
    assert int(re.search(r"Execution count: (\d+)", server_part).group(1)) < int(
        re.search(r"Inference count: (\d+)", server_part).group(1))
