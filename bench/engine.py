"""Engine bench: nnserve vs ONNX Runtime, PyTorch eager and ncnn on full-size CNNs, interleaved in one process.

    .venv-dev/bin/python bench/engine.py                       # 5 models x batch 1 and 8, appends to RESULTS.md
    .venv-dev/bin/python bench/engine.py resnet18 --batches 1 --no-record
    .venv-dev/bin/python bench/engine.py --peers "" --no-record   # nnserve alone (before/after comparisons)

Needs the bench models (`.venv-dev/bin/python tools/make_fixtures.py --bench`) and the peers of .venv-dev.
Every iteration runs each engine once, in rotating order, so machine noise hits all of them alike; the ratios
nnserve/peer come from this one run. Outputs are compared across engines (max abs diff against nnserve) so a
fast wrong answer cannot win, and nnserve's per-op-type time shows where its time goes.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

# Engines share the process and take turns: thread pools that busy-wait after a call (OpenMP in PyTorch,
# OpenBLAS, numba) would steal the cores from whichever engine runs next. Set before any of them loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# This file is bench/engine.py: the repository root must come before bench/ or `import engine` finds itself.
_BENCH, _ROOT = str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])
sys.path[:] = [_ROOT, _BENCH] + [p for p in sys.path if p not in (_BENCH, _ROOT, "")]

from _peers import CORES, MODELS, NcnnRunner, OrtRunner, TorchRunner, dynamic_exports  # noqa: E402
from _results import append_run, machine, markdown_table  # noqa: E402

import engine  # noqa: E402

NAMES = ["resnet18", "mobilenet_v2", "squeezenet1_1", "shufflenet_v2_x1_0", "efficientnet_b0"]
PEERS = ["onnxruntime", "pytorch", "ncnn"]
Runner = Callable[[np.ndarray], np.ndarray]


class NnserveRunner:
    def __init__(self, param: Path, batch: int, size: int):
        model = engine.load(param)
        self.input, self.output = model.inputs[0].name, model.outputs[0].name
        self.nodes = {n.name: n for n in model.graph.nodes}
        self.instance = model.instance(max_shapes={self.input: (batch, 3, size, size)})

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.instance.run({self.input: x})[self.output]

    def op_breakdown(self, x: np.ndarray, runs: int = 3) -> tuple[dict[str, float], dict[str, float]]:
        """Seconds per op type and per convolution class, mean over `runs` timed runs."""
        per_op: dict[str, float] = defaultdict(float)
        per_conv: dict[str, float] = defaultdict(float)
        for _ in range(runs):
            self.instance.run({self.input: x}, timings=True)
            for name, op, seconds in self.instance.last_timings["nodes"]:
                per_op[op] += seconds / runs
                if op in ("Conv", "ConvBlocked") and name in self.nodes:
                    per_conv[conv_class(self.nodes[name])] += seconds / runs
        return dict(per_op), dict(per_conv)


def conv_class(node) -> str:
    """"3x3 s1", "1x1 s1", "3x3 s2 dw" ...: the shape classes the conv kernels pick their paths by."""
    w = node.attrs.get("weight")
    if w is None and len(node.inputs) > 1 and node.inputs[1].const is not None:
        w = node.inputs[1].const
    kh, kw = (w.shape[2], w.shape[3]) if w is not None and w.ndim == 4 else ("?", "?")
    stride = node.params.get("stride", (1, 1))
    groups = int(node.params.get("groups", 1))
    kind = " dw" if w is not None and groups > 1 and groups == w.shape[0] else (f" g{groups}" if groups > 1 else "")
    return f"{kh}x{kw} s{stride[0] if isinstance(stride, (tuple, list)) else stride}{kind}"


def make_runners(name: str, batch: int, peers: list[str]) -> dict[str, Runner]:
    base = MODELS / name
    size = int(np.load(base / "input.npy").shape[-1])
    # Batch 1 uses the fixture's own (static) files; batch 8 needs the batch-dynamic re-export.
    src = base if batch == 1 else dynamic_exports(name)
    onnx = base / "model.onnx" if batch == 1 else src / "model.onnx"
    runners: dict[str, Runner] = {"nnserve": NnserveRunner(src / "model.pnnx.param", batch, size)}
    if "onnxruntime" in peers:
        runners["onnxruntime"] = OrtRunner(onnx)
    if "pytorch" in peers:
        runners["pytorch"] = TorchRunner(name)
    if batch == 1 and "ncnn" in peers:
        runners["ncnn"] = NcnnRunner(base)
    return runners


def bench_one(runners: dict[str, Runner], x: np.ndarray, iters: int, warmup: int) -> tuple[dict, dict]:
    """Median seconds per engine (round-robin, rotating start) and each engine's output."""
    names = list(runners)
    outputs = {n: runners[n](x) for n in names}
    for _ in range(warmup - 1):
        for n in names:
            runners[n](x)
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(iters):
        for n in names[i % len(names):] + names[:i % len(names)]:
            t = time.perf_counter()
            runners[n](x)
            times[n].append(time.perf_counter() - t)
    return {n: statistics.median(t) for n, t in times.items()}, outputs


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def breakdown_text(per_op: dict[str, float], top: int = 8) -> str:
    total = sum(per_op.values())
    items = sorted(per_op.items(), key=lambda kv: -kv[1])[:top]
    return ", ".join(f"{op} {s * 1e3:.1f} ms ({s / total:.0%})" for op, s in items) + f"; sum {total * 1e3:.1f} ms"


def run(names: list[str], batches: list[int], iters: dict[int, int], warmup: int, peers: list[str]) -> dict:
    rows, breakdowns, ratios = [], [], defaultdict(list)
    for batch in batches:
        for name in names:
            x1 = np.load(MODELS / name / "input.npy").astype(np.float32)
            x = np.ascontiguousarray(np.repeat(x1, batch, axis=0))
            runners = make_runners(name, batch, peers)
            med, outs = bench_one(runners, x, iters[batch], warmup)
            ref = outs["nnserve"]
            diffs = {p: float(np.abs(outs[p].reshape(ref.shape) - ref).max()) for p in PEERS if p in outs}
            row = {"model": name, "batch": batch, "median": med, "diff": diffs, "scale": float(np.abs(ref).max())}
            for p in PEERS:
                if p in med:
                    ratios[(batch, p)].append(med["nnserve"] / med[p])
            rows.append(row)
            per_op, per_conv = runners["nnserve"].op_breakdown(x)
            breakdowns.append((name, batch, per_op, per_conv))
            print_row(row)
            print(f"    nnserve per op: {breakdown_text(per_op)}", flush=True)
            print(f"    nnserve Conv by class: {breakdown_text(per_conv)}", flush=True)
    return {"rows": rows, "ratios": ratios, "breakdowns": breakdowns}


def print_row(row: dict) -> None:
    med = row["median"]
    cells = [f"{e} {med[e] * 1e3:7.2f} ms" for e in ["nnserve", *PEERS] if e in med]
    ratio = [f"/{p} {med['nnserve'] / med[p]:.2f}x" for p in PEERS if p in med]
    diff = [f"{p} {d:.1e}" for p, d in row["diff"].items()]
    print(f"{row['model']:<20} b{row['batch']}  " + "  ".join(cells) + "  | nnserve" + " ".join(ratio)
          + f"  | max|diff| {', '.join(diff)} (|out| <= {row['scale']:.1f})", flush=True)


def targets(res: dict, batches: list[int]) -> list[str]:
    lines, ratios = [], res["ratios"]
    if not ratios[(batches[0], "onnxruntime")]:  # nnserve alone (or without ORT): no targets to check
        return lines
    if 8 in batches:
        g = geomean(ratios[(8, "onnxruntime")])
        lines.append(f"batch 8 geomean nnserve/ORT {g:.2f}x (target <= 1.00): {'MET' if g <= 1.0 else 'NOT MET'}")
    if 1 in batches:
        g = geomean(ratios[(1, "onnxruntime")])
        lines.append(f"batch 1 geomean nnserve/ORT {g:.2f}x (target <= 1.25): {'MET' if g <= 1.25 else 'NOT MET'}")
        for peer in ("pytorch", "ncnn"):
            slower = [r["model"] for r in res["rows"] if r["batch"] == 1 and peer in r["median"]
                      and r["median"]["nnserve"] >= r["median"][peer]]
            verdict = "MET" if not slower else f"NOT MET (slower on {', '.join(slower)})"
            lines.append(f"batch 1 faster than {peer} on every model: {verdict}")
    for batch in batches:
        for peer in PEERS:
            if ratios[(batch, peer)]:
                lines.append(f"batch {batch} geomean nnserve/{peer}: {geomean(ratios[(batch, peer)]):.2f}x")
    return lines


def report(res: dict, batches: list[int], iters: dict[int, int]) -> str:
    header = ["model", "batch", "nnserve ms", "ORT ms", "PyTorch ms", "ncnn ms", "/ORT", "/PyTorch", "/ncnn",
              "max abs diff vs nnserve (ORT, PyTorch, ncnn)"]
    rows = []
    for r in res["rows"]:
        med = r["median"]
        ms = [f"{med[e] * 1e3:.2f}" if e in med else "-" for e in ["nnserve", *PEERS]]
        rat = [f"{med['nnserve'] / med[p]:.2f}" if p in med else "-" for p in PEERS]
        diff = ", ".join(f"{r['diff'][p]:.1e}" for p in PEERS if p in r["diff"])
        rows.append([r["model"], str(r["batch"]), *ms, *rat, diff])
    parts = [f"Median latency over {', '.join(f'{iters[b]} iterations at batch {b}' for b in batches)} "
             f"(interleaved, threads = {CORES} for every engine). Ratio = nnserve / peer (< 1 means nnserve "
             "is faster).", markdown_table(header, rows), "Targets:\n\n" + "\n".join(f"- {t}" for t in
                                                                                     targets(res, batches)),
             "nnserve time per op type, and of Conv per kernel-size/stride/depthwise class (top 8, mean of 3 "
             "timed runs after the timed loop):\n\n" + "\n".join(
                 f"- {n} b{b}: {breakdown_text(p)}\n  - Conv: {breakdown_text(c)}"
                 for n, b, p, c in res["breakdowns"])]
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=NAMES)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--iters1", type=int, default=20, help="timed iterations at batch 1")
    ap.add_argument("--iters8", type=int, default=8, help="timed iterations at other batches")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--peers", default=",".join(PEERS), help="peers timed beside nnserve, comma-separated "
                    "(default all; \"\" times nnserve alone)")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    peers = [p for p in args.peers.split(",") if p]
    if set(peers) - set(PEERS):
        ap.error(f"unknown peers {sorted(set(peers) - set(PEERS))}; known: {', '.join(PEERS)}")
    iters = {b: args.iters1 if b == 1 else args.iters8 for b in batches}
    print(machine(), flush=True)
    res = run(args.models, batches, iters, args.warmup, peers)
    for line in targets(res, batches):
        print(line)
    if not args.no_record:
        append_run("Engine", report(res, batches, iters))
    return 0


if __name__ == "__main__":
    sys.exit(main())
