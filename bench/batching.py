"""Batching bench (issue 4): ResNet-18 throughput at concurrency 8 with dynamic batching vs without.

    .venv/bin/python bench/batching.py [--rounds 6] [--window-ms 3000] [--delay-us 200000]

Server configuration. One nnserve process serves the batch-dynamic ResNet-18 (bench/models/resnet18/dyn, from
bench/_peers.py) under two names, from the same (hard-linked) model files, with the same engine thread count
(NNSERVE_NUM_THREADS, pinned by this script for the server and the in-process figures alike):
- `resnet18_single`: max_batch_size 8, one instance, no dynamic_batching: every request runs alone (the baseline);
- `resnet18_batched`: the same plus dynamic_batching { preferred_batch_size [8], max_queue_delay --delay-us }.
Only 8 is preferred: a reachable preferred size is dispatched at once, so preferring 4 would send half batches
whenever the first four of eight clients' requests arrive before the rest. The delay is long on purpose
(200 ms, of the order of one batch-8 execution): the delay counts from a request's arrival, and requests that
arrive while a batch executes have already waited when the instance frees up. With a short delay (2 ms, the
earlier setting) eight clients split into two groups of k and 8 - k that take turns on the instance (mean
executed batch ~4); a delay longer than the arrival spread of the eight requests lets the batch fill to 8
(8 = max_batch_size dispatches at once, so the delay is never waited out at c=8).
Only one model is driven at a time, so the idle one costs nothing but its arena.

Method. The machine is shared and noisy, so no single window decides anything: the bench runs --rounds rounds;
each round measures both models over HTTP and over gRPC, alternating which model goes first (ABBA), so slow
drifts of the machine's load hit both alike. A window is one perf_analyzer run (tools/perf_analyzer.sh) at
concurrency 8, sync requests of batch 1 with the bench's real input, 3 x --window-ms merged into one figure.
Around each window the server's /metrics give the mean executed batch (nv_inference_count /
nv_inference_exec_count) and the batch-size histogram (nnserve_batch_size); the statistics API's batch_stats give
each execution's compute (input + infer + output, per execution and so exact whatever the batch sizes; the
Prometheus sums add a batch's time once per request in it), set against its cycle (mean batch / throughput): the
rest is the instance's idle time, the replies going out and the next requests coming in. The figure per configuration is
the median over the rounds; the ratio batched/single of the medians is checked against the 1.5x target, and
the per-round (paired) ratios are shown for the spread. Before the server starts, the in-process engine's
throughput at batch 1 and batch 8 gives the ceiling: serving one request at a time can not beat the batch-1
rate, batching can not beat the batch-8 rate, so their ratio bounds what dynamic batching can deliver.
Appends to bench/RESULTS.md ("Batching").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# This directory holds bench/engine.py: the repository root must come first or `import engine` finds it.
_BENCH, _ROOT = str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])
sys.path[:] = [_ROOT, _BENCH] + [p for p in sys.path if p not in (_BENCH, _ROOT, "")]

import _serving as sv  # noqa: E402
from _results import append_run, markdown_table  # noqa: E402

SINGLE, BATCHED = "resnet18_single", "resnet18_batched"
PROTOCOLS = ("http", "grpc")
TARGET = 1.5
INPUT = sv.ROOT / "bench" / "models" / "resnet18" / "input.npy"
FAILURES: list[str] = []  # perf_analyzer runs that failed and were retried
BUCKETS = ("1", "2", "4", "8")  # nnserve_batch_size bucket bounds up to max_batch_size (le, cumulative)
CONFIG = """name: "{name}"
backend: "pnnx"
max_batch_size: 8
input [ {{ name: "in0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] }} ]
output [ {{ name: "out0" data_type: TYPE_FP32 dims: [ 1000 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{batching}"""
BATCHING = "dynamic_batching {{ preferred_batch_size: [ 8 ] max_queue_delay_microseconds: {delay_us} }}\n"


@dataclass
class Snapshot:
    """The batching counters of one model at one moment."""

    count: float = 0.0  # nv_inference_count: rows executed
    execs: float = 0.0  # nv_inference_exec_count: executions
    buckets: dict[str, float] = field(default_factory=dict)  # nnserve_batch_size cumulative bucket counts


@dataclass
class Window:
    model: str
    protocol: str
    round: int
    perf: sv.PerfResult
    mean_batch: float
    histogram: dict[str, int]  # executions per batch-size class in this window ("1", "2", "3-4", "5-8")
    compute_ms: float = float("nan")  # one execution's compute (input + infer + output), mean over the window

    @property
    def idle_ms(self) -> float:
        """The instance's idle time per execution: the cycle perf_analyzer saw (mean batch / throughput) minus
        the execution itself. Between two batches of a closed loop of 8 clients this is the replies going out
        and the next 8 requests coming in, which nothing can overlap with computing."""
        if self.perf.error or not self.perf.throughput:
            return float("nan")
        return 1e3 * self.mean_batch / self.perf.throughput - self.compute_ms


def write_repo(repo: Path, delay_us: int, adaptive: bool = False) -> None:
    batched = BATCHING.format(delay_us=delay_us) + (sv.ADAPTIVE_WAIT if adaptive else "")
    for name, batching in ((SINGLE, ""), (BATCHED, batched)):
        version = repo / name / "1"
        version.mkdir(parents=True)
        for suffix in ("pnnx.param", "pnnx.bin"):
            src, dst = sv.RESNET_DYN / f"model.{suffix}", version / f"model.{suffix}"
            try:  # the same files for both models: a hard link (the server refuses symlinks leaving the repo)
                dst.hardlink_to(src)
            except OSError:
                dst.write_bytes(src.read_bytes())
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, batching=batching))


def scrape(metrics_url: str, model: str) -> Snapshot:
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    labels = rf'\{{(?=[^}}]*model="{re.escape(model)}")([^}}]*)\}} ([\d.e+]+)$'
    snap = Snapshot()
    for line in text.splitlines():
        if m := re.match(rf"nv_inference_count{labels}", line):
            snap.count = float(m.group(2))
        elif m := re.match(rf"nv_inference_exec_count{labels}", line):
            snap.execs = float(m.group(2))
        elif m := re.match(rf"nnserve_batch_size_bucket{labels}", line):
            le = re.search(r'le="([^"]+)"', m.group(1))
            if le:
                snap.buckets[le.group(1).removesuffix(".0")] = float(m.group(2))
    return snap


def execution_compute(stats_url: str) -> tuple[int, int]:
    """(executions, their compute ns: input + infer + output) summed over the statistics API's batch_stats."""
    with urllib.request.urlopen(stats_url, timeout=10) as r:
        rows = [row for model in json.load(r)["model_stats"] for row in model["batch_stats"]]
    phases = ("compute_input", "compute_infer", "compute_output")
    return (sum(row["compute_infer"]["count"] for row in rows),
            sum(row[p]["ns"] for row in rows for p in phases))


def window_histogram(before: Snapshot, after: Snapshot) -> dict[str, int]:
    """Executions per batch-size class between two snapshots (the buckets are cumulative)."""
    hist, below = {}, 0.0
    for lo, le in zip(("1", "2", "3", "5"), BUCKETS, strict=True):
        cum = after.buckets.get(le, 0.0) - before.buckets.get(le, 0.0)
        hist[le if lo == le else f"{lo}-{le}"] = int(round(cum - below))
        below = cum
    return hist


def engine_ceiling(iters: int) -> dict[int, float]:
    """In-process ResNet-18 images/s at batch 1 and 8 (median of `iters` runs each, the two batches alternated
    so that the machine's load drifts hit both; one instance per batch size)."""
    import engine

    model = engine.load(sv.RESNET_DYN / "model.pnnx.param")
    x1 = np.load(INPUT).astype(np.float32)
    runs = {}
    for batch in (1, 8):
        inst = model.instance(max_shapes={"in0": (batch, 3, 224, 224)})
        x = np.ascontiguousarray(np.repeat(x1, batch, axis=0))
        inst.run({"in0": x})  # warm-up: first-call compilation and caches
        runs[batch] = (inst, x)
    times: dict[int, list[float]] = {1: [], 8: []}
    for _ in range(iters):
        for batch, (inst, x) in runs.items():
            t = time.perf_counter()
            inst.run({"in0": x})
            times[batch].append(time.perf_counter() - t)
    rates = {}
    for batch, ts in times.items():
        rates[batch] = batch / statistics.median(ts)
        print(f"engine in-process batch {batch}: {statistics.median(ts) * 1e3:7.1f} ms = "
              f"{rates[batch]:6.1f} images/s (median of {iters})", flush=True)
    return rates


def one_window(model: str, protocol: str, url: str, rnd: int, window_ms: int, data: str,
               metrics: str, http: str) -> Window:
    stats = f"http://{http}/v2/models/{model}/stats"
    before, compute_before = scrape(metrics, model), execution_compute(stats)
    r = sv.perf(model, protocol, url, 8, window_ms, data)
    if r.error:  # one retry: a failed window is reported, not silently replaced
        print(f"round {rnd} {model:<16} {protocol:<4} failed ({r.error}); retrying once", flush=True)
        FAILURES.append(f"round {rnd} {model} {protocol}: {r.error}")
        before, compute_before = scrape(metrics, model), execution_compute(stats)
        r = sv.perf(model, protocol, url, 8, window_ms, data)
    after, compute_after = scrape(metrics, model), execution_compute(stats)
    execs = after.execs - before.execs
    ran, compute_ns = (a - b for a, b in zip(compute_after, compute_before, strict=True))
    w = Window(model, protocol, rnd, r, (after.count - before.count) / execs if execs else float("nan"),
               window_histogram(before, after), compute_ns / ran / 1e6 if ran else float("nan"))
    print(f"round {rnd} {model:<16} {protocol:<4} " + (
        f"{r.throughput:6.2f} infer/s  p50 {r.p50_us / 1e3:7.1f} ms  p99 {r.p99_us / 1e3:7.1f} ms  "
        f"mean batch {w.mean_batch:.2f}  execution {w.compute_ms:.1f} ms + idle {w.idle_ms:.1f} ms  "
        f"executions by batch size {w.histogram}" if not r.error else f"FAILED: {r.error}"), flush=True)
    return w


def measure(rounds: int, window_ms: int, delay_us: int, adaptive: bool = False) -> list[Window]:
    windows = []
    with tempfile.TemporaryDirectory(prefix="nnserve-bench-batching-") as d:
        repo = Path(d) / "repo"
        write_repo(repo, delay_us, adaptive)
        data = str(sv.perf_input_file(np.load(INPUT), Path(d) / "input.json"))
        proc, http, grpc = sv.start_nnserve(repo)
        urls = {"http": http, "grpc": grpc}
        metrics = f"http://127.0.0.1:{proc.ports['metrics']}/metrics"
        try:
            for model in (SINGLE, BATCHED):
                sv.perf(model, "http", http, 8, 1000, data)  # warm-up, not recorded
            for rnd in range(rounds):
                order = (SINGLE, BATCHED) if rnd % 2 == 0 else (BATCHED, SINGLE)
                for protocol in PROTOCOLS:
                    for model in order:
                        windows.append(one_window(model, protocol, urls[protocol], rnd, window_ms, data, metrics,
                                              http))
        finally:
            proc.stop()
    return windows


def rates(windows: list[Window], model: str, protocol: str) -> list[float]:
    return [w.perf.throughput for w in windows if w.model == model and w.protocol == protocol and not w.perf.error]


def verdicts(windows: list[Window]) -> list[str]:
    lines = []
    for protocol in PROTOCOLS:
        single, batched = rates(windows, SINGLE, protocol), rates(windows, BATCHED, protocol)
        if not single or not batched:
            lines.append(f"{protocol}: no successful window for one of the models: NOT MEASURED")
            continue
        gain = statistics.median(batched) / statistics.median(single)
        paired = paired_ratios(windows, protocol)
        met = sum(r >= TARGET for r in paired)
        lines.append(
            f"{protocol}: median {statistics.median(batched):.2f} vs {statistics.median(single):.2f} infer/s = "
            f"{gain:.2f}x (target >= {TARGET}x): {'MET' if gain >= TARGET else 'NOT MET'} by {gain - TARGET:+.2f}x "
            f"({(gain / TARGET - 1) * 100:+.0f}%); per-round ratios {', '.join(f'{r:.2f}' for r in paired)} "
            f"({met} of {len(paired)} rounds >= {TARGET}x)")
    return lines


def paired_ratios(windows: list[Window], protocol: str) -> list[float]:
    by_round: dict[int, dict[str, float]] = {}
    for w in windows:
        if w.protocol == protocol and not w.perf.error:
            by_round.setdefault(w.round, {})[w.model] = w.perf.throughput
    return [r[BATCHED] / r[SINGLE] for _, r in sorted(by_round.items()) if r.get(SINGLE) and r.get(BATCHED)]


def summary_table(windows: list[Window]) -> str:
    rows = []
    for protocol in PROTOCOLS:
        for model in (SINGLE, BATCHED):
            ws = [w for w in windows if w.model == model and w.protocol == protocol and not w.perf.error]
            if not ws:
                rows.append([model, protocol, "failed", "", "", "", "", ""])
                continue
            hist = {k: sum(w.histogram[k] for w in ws) for k in ws[0].histogram}
            rows.append([model, protocol, f"{statistics.median(w.perf.throughput for w in ws):.2f}",
                         " / ".join(f"{w.perf.throughput:.2f}" for w in ws),
                         f"{statistics.median(w.perf.p50_us for w in ws) / 1e3:.0f}",
                         f"{statistics.median(w.mean_batch for w in ws):.2f}",
                         f"{_median_of(ws, 'compute_ms'):.1f} + {_median_of(ws, 'idle_ms'):.1f}",
                         ", ".join(f"{k}: {v}" for k, v in hist.items())])
    return markdown_table(["model", "protocol", "median infer/s", "per window (round order)", "median p50 ms",
                           "median mean executed batch", "median ms per execution: compute + idle",
                           "executions by batch size (all windows)"], rows)


def _median_of(windows: list[Window], attr: str) -> float:
    return statistics.median(getattr(w, attr) for w in windows)


def record(args: argparse.Namespace, windows: list[Window], ceiling: dict[int, float], lines: list[str]) -> None:
    ceiling_line = (f"In-process engine (same threads), ResNet-18: batch 1 {ceiling[1]:.1f} images/s, batch 8 "
                    f"{ceiling[8]:.1f} images/s: ceiling of the batched/single ratio {ceiling[8] / ceiling[1]:.2f}x."
                    if ceiling else "In-process engine: not measured (--no-engine).")
    append_run("Batching", "\n\n".join([
        f"ResNet-18 (224x224), one nnserve process, {args.rounds} rounds alternating the models (ABBA), each "
        f"round one window per model and protocol; a window is one perf_analyzer run at concurrency 8, sync "
        f"requests of batch 1, 3 x {args.window_ms} ms merged. Both models: the same files, 1 instance, "
        f"NNSERVE_NUM_THREADS={os.environ['NNSERVE_NUM_THREADS']}, max_batch_size 8; batched adds "
        f"dynamic_batching {{ preferred_batch_size [8], max_queue_delay {args.delay_us} us }}"
        + (" with the adaptive wait." if args.adaptive else "."),
        summary_table(windows), ceiling_line,
        "Failed windows (retried once): " + ("; ".join(FAILURES) if FAILURES else "none") + ".",
        "\n".join(f"- {line}" for line in lines)]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--window-ms", type=int, default=3000, help="perf_analyzer -p (3 of them per window)")
    ap.add_argument("--delay-us", type=int, default=200_000, help="max_queue_delay_microseconds of the batched model")
    ap.add_argument("--threads", type=int, default=0, help="NNSERVE_NUM_THREADS (default: the engine's own)")
    ap.add_argument("--engine-iters", type=int, default=12)
    ap.add_argument("--no-engine", action="store_true", help="skip the in-process ceiling")
    ap.add_argument("--adaptive", action="store_true", help="the batched model uses dynamic_batching_wait adaptive")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args(argv)
    # SIGTERM ends the bench through SystemExit, so the server it started is stopped too (finally in measure).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.threads:
        os.environ["NNSERVE_NUM_THREADS"] = str(args.threads)
    elif not os.environ.get("NNSERVE_NUM_THREADS"):
        from engine.devices.cpu.threads import default_threads

        os.environ["NNSERVE_NUM_THREADS"] = str(default_threads())
    ceiling = {} if args.no_engine else engine_ceiling(args.engine_iters)
    windows = measure(args.rounds, args.window_ms, args.delay_us, args.adaptive)
    lines = verdicts(windows)
    print("\n".join(lines))
    if not args.no_record:
        record(args, windows, ceiling, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
