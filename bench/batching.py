"""Batching bench (issue 4): ResNet-18 throughput at concurrency 8 with dynamic batching vs without.

    .venv/bin/python bench/batching.py

One nnserve process serves the batch-dynamic ResNet-18 (bench/models/resnet18/dyn, from bench/_peers.py) twice:
`resnet18_batched` (max_batch_size 8, dynamic_batching, 2 ms max queue delay) and `resnet18_single` (the same
without dynamic_batching, so every request runs alone); one instance each, so the only difference is batching.
perf_analyzer drives each at concurrency 8 over HTTP and gRPC; the mean executed batch comes from the server's
nv_inference_count / nv_inference_exec_count. Target: batched >= 1.5x single. Appends to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

_BENCH = str(Path(__file__).resolve().parent)
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)

import _serving as sv  # noqa: E402
from _results import append_run, markdown_table  # noqa: E402

MODELS = {"resnet18_single": False, "resnet18_batched": True}
INPUT = sv.ROOT / "bench" / "models" / "resnet18" / "input.npy"


def measure(concurrency: int, window_ms: int) -> dict:
    results = {}
    with tempfile.TemporaryDirectory(prefix="nnserve-bench-batching-") as d:
        repo = Path(d) / "repo"
        for name, batching in MODELS.items():
            sv.write_resnet(repo, name, batching=batching)
        data = str(sv.perf_input_file(np.load(INPUT), Path(d) / "input.json"))
        proc, http, grpc = sv.start_nnserve(repo)
        metrics = f"http://127.0.0.1:{proc.ports['metrics']}/metrics"
        try:
            for name in MODELS:
                sv.perf(name, "http", http, 1, 1000, data)  # warm-up
                for protocol, url in (("http", http), ("grpc", grpc)):
                    before = sv.counters(metrics, name)
                    r = sv.perf(name, protocol, url, concurrency, window_ms, data)
                    after = sv.counters(metrics, name)
                    execs = after[1] - before[1]
                    mean_batch = (after[0] - before[0]) / execs if execs else float("nan")
                    results[(name, protocol)] = (r, mean_batch)
                    print(f"{name:<17} {protocol:<5} c={concurrency}: " + (
                        f"{r.throughput:7.1f} infer/s  p50 {r.p50_us / 1e3:7.1f} ms  p99 {r.p99_us / 1e3:7.1f} ms  "
                        f"mean batch {mean_batch:.2f}" if not r.error else f"FAILED: {r.error}"), flush=True)
        finally:
            proc.stop()
    return results


def verdicts(results: dict) -> list[str]:
    lines = []
    for protocol in ("http", "grpc"):
        single, batched = results[("resnet18_single", protocol)][0], results[("resnet18_batched", protocol)][0]
        gain = batched.throughput / single.throughput if single.throughput else float("nan")
        lines.append(f"{protocol}: dynamic batching {gain:.2f}x the throughput without (target >= 1.5x): "
                     f"{'MET' if gain >= 1.5 else 'NOT MET'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--window-ms", type=int, default=10000)
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args(argv)
    results = measure(args.concurrency, args.window_ms)
    lines = verdicts(results)
    print("\n".join(lines))
    if not args.no_record:
        rows = [[name, protocol, f"{r.throughput:.1f}", f"{r.p50_us / 1e3:.1f}", f"{r.p99_us / 1e3:.1f}",
                 f"{mb:.2f}"] for (name, protocol), (r, mb) in results.items()]
        table = markdown_table(["model", "protocol", "infer/s", "p50 ms", "p99 ms", "mean executed batch"], rows)
        append_run("Batching", f"ResNet-18 (224x224), perf_analyzer at concurrency {args.concurrency}, sync "
                   f"requests of batch 1, window {args.window_ms} ms, one instance per model.\n\n{table}\n\n"
                   + "\n".join(f"- {line}" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
