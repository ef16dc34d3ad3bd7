"""Per-layer sweep: nnserve against ONNX Runtime on the same single-layer graphs (not a test).

    python bench/layers.py [--quick] [--rounds 3] [--only attention] [--record]

Needs onnx and onnxruntime (the dev extra). The points (bench/layer_points.py) cover what users' models use:
convolutions with kernels 1-7 and 1-D ones, stride 1-2, dilation 1-36, dense / grouped / depthwise, channels 3 to
1024 including small and odd counts, maps 7-640, transposed convolutions, pooling, resize, attention over 16-4096
tokens, softmax over short and long rows; `--quick` takes the known cliffs and their neighbours (a few minutes).
Each engine runs in its own process with its shipped defaults (ORT: a default SessionOptions; nnserve: an instance
with its default device options), one process per engine per round, the order alternating between rounds so that
drift hits both; a point's time is the median of its per-round medians (wall clock; the process CPU time per call is
shown too, where ORT's count includes its threads' spinning). The table lists the worst ratio first, with the
kernels nnserve ran (a `fallback` there is a numpy reference) and the largest difference between the two outputs,
relative to the largest output magnitude. `--threads N` gives both engines N threads (a diagnostic apart from the
defaults: on a loaded machine it separates the kernels' work from thread wake-ups). `--record` appends the table to
bench/RESULTS.md ("Layers").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before bench/engine.py

from bench import layer_points as P  # noqa: E402
from bench._results import append_run, markdown_table  # noqa: E402

ENGINES = ("nnserve", "ort")


def _time_calls(fn, budget_s: float, min_reps: int, max_reps: int) -> tuple[list[float], list[float]]:
    """Wall-clock and process CPU seconds of each timed call (after two warm-up calls: JIT, primitive creation,
    first touch of the arena)."""
    fn()
    fn()
    wall: list[float] = []
    cpu: list[float] = []
    start = time.perf_counter()
    while len(wall) < max_reps and (len(wall) < min_reps or time.perf_counter() - start < budget_s):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return wall, cpu


def _nnserve_runner(p: dict, threads: int | None):
    from engine.devices.cpu.onednn.blocked import native_block
    from engine.runtime.loading import prepare
    from engine.runtime.model import Model

    graph = prepare(P.nnserve_graph(p))
    block = native_block()
    if p.get("context") == "blocked" and block:
        graph = blocked_conv(graph, block)  # the device's own `decide` then leaves it as it is
    inst = Model(graph).instance("cpu", threads=threads)
    feeds = {n: a for n, a in P.weights(p).items() if n in P.input_names(p)}
    kernels = [_kernel_name(c) for c in inst._compiled.nodes if c.kernel is not None]
    return (lambda: inst.run(feeds)[inst.graph.outputs[0].name]), " ".join(kernels)


def blocked_conv(graph, block: int):
    """The one-conv graph with the conv's input and output in the blocked layout, as between two convolutions of
    a network: ToBlocked -> ConvBlocked -> ToPlain (the layout rewrite keeps graph inputs and outputs plain, so
    on its own it would leave a lone conv NCHW)."""
    from engine.devices.cpu.layout.rewrite import physical

    (conv,) = [n for n in graph.nodes if n.op_type == "Conv"]
    x, y = conv.inputs[0], conv.outputs[0]
    xb = graph.value(f"{x.name}.blocked", physical(x.shape, block), x.dtype)
    yb = graph.value(f"{y.name}.blocked", physical(y.shape, block), y.dtype)
    yp = graph.value(f"{y.name}.plain", y.shape, y.dtype)
    at = graph.nodes.index(conv)
    src_blocked = x.shape[1] >= block  # as the rewrite does: an image with fewer channels is read plain
    if src_blocked:
        graph.add_node("ToBlocked", [x], [xb], params={"block": block, "channels": int(x.shape[1])}, index=at)
    params = dict(conv.params, src_blocked=src_blocked, dst_blocked=True, block=block)
    graph.add_node("ConvBlocked", [xb if src_blocked else x], [yb], params=params, attrs=dict(conv.attrs),
                   index=at + 1)
    graph.add_node("ToPlain", [yb], [yp], params={"block": block, "channels": int(y.shape[1])}, index=at + 2)
    graph.replace_uses(y, yp)
    graph.remove_node(conv)
    return graph


def _kernel_name(c) -> str:
    """op:impl, the impl as the kernel reports it (oneDNN's implementation name), else the module it comes from."""
    k = c.kernel
    if getattr(k, "is_fallback", False):
        impl = "fallback"
    else:
        impl = getattr(k, "impl", None) or getattr(k, "__module__", "?").rsplit(".", 1)[-1]
    return f"{c.node.op_type}:{impl}"


def _ort_runner(p: dict, threads: int | None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    sess = ort.InferenceSession(P.onnx_model(p).SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {n: a for n, a in P.weights(p).items() if n in P.input_names(p)}
    return (lambda: sess.run(None, feeds)[0]), ""


def worker(engine: str, points: list[dict], out_dir: Path, save: bool, budget_s: float,
           threads: int | None) -> list[dict]:
    runner = _nnserve_runner if engine == "nnserve" else _ort_runner
    results = []
    for i, p in enumerate(points):
        try:
            fn, kernels = runner(p, threads)
            wall, cpu = _time_calls(fn, budget_s, 3, 200)
            if save:
                np.save(out_dir / f"{engine}-{i}.npy", fn())
            results.append({"ms": 1e3 * statistics.median(wall), "cpu_ms": 1e3 * statistics.median(cpu),
                            "kernels": kernels})
        except Exception as e:  # a point one engine refuses is reported, not fatal to the sweep
            results.append({"ms": math.nan, "cpu_ms": math.nan, "kernels": f"error: {type(e).__name__}: {e}"[:200]})
        print(f"{engine} {i + 1}/{len(points)} {P.name_of(p)}: {results[-1]['ms']:.3f} ms", file=sys.stderr,
              flush=True)
    return results


def _run_worker(engine: str, spec: Path, out_dir: Path, save: bool, budget_s: float,
                threads: int | None) -> list[dict]:
    cmd = [sys.executable, __file__, "--worker", engine, "--spec", str(spec), "--out-dir", str(out_dir),
           "--budget", str(budget_s)] + (["--save"] if save else []) + ([f"--threads={threads}"] if threads else [])
    res = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(res.stdout)


def _rel_err(out_dir: Path, i: int) -> float:
    try:
        a, b = np.load(out_dir / f"nnserve-{i}.npy"), np.load(out_dir / f"ort-{i}.npy")
    except OSError:
        return math.nan
    if a.shape != b.shape:
        return math.inf
    scale = max(float(np.nanmax(np.abs(b))), 1e-30) if b.size else 1.0
    return float(np.nanmax(np.abs(a.astype(np.float64) - b))) / scale if a.size else 0.0


def _require_peer() -> None:
    """Fails before the sweep when ONNX Runtime or onnx is missing: every ORT point would fail, and a table of
    nan ratios is no measurement."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"bench/layers.py needs onnx and onnxruntime (pip install -e '.[dev]'): {e}") from e


def _failures(per_engine: dict[str, list[list[dict]]], points: list[dict]) -> list[str]:
    """'engine point: error' for every point an engine refused in any round (its median is then nan)."""
    return [f"{engine} {P.name_of(p)} (round {r + 1}): {res['kernels']}" for engine, runs in per_engine.items()
            for r, run in enumerate(runs) for p, res in zip(points, run, strict=True) if math.isnan(res["ms"])]


def sweep(points: list[dict], rounds: int, budget_s: float, threads: int | None = None) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="nnserve-layers-") as tmp:
        tmp_dir = Path(tmp)
        spec = tmp_dir / "points.json"
        spec.write_text(json.dumps(points))
        per_engine: dict[str, list[list[dict]]] = {e: [] for e in ENGINES}
        for r in range(rounds):
            order = ENGINES if r % 2 == 0 else ENGINES[::-1]
            for engine in order:
                per_engine[engine].append(_run_worker(engine, spec, tmp_dir, r == 0, budget_s, threads))
        failed = _failures(per_engine, points)
        for line in failed:
            print(f"failed: {line}", file=sys.stderr)
        if any(all(math.isnan(res["ms"]) for res in per_engine[e][0]) for e in ENGINES):
            raise SystemExit("an engine failed on every point (errors above): no table")
        rows = []
        for i, p in enumerate(points):
            ours = [run[i]["ms"] for run in per_engine["nnserve"]]
            theirs = [run[i]["ms"] for run in per_engine["ort"]]
            ms, ort_ms = statistics.median(ours), statistics.median(theirs)
            cpu = [statistics.median(run[i]["cpu_ms"] for run in per_engine[e]) for e in ENGINES]
            rows.append({"name": P.name_of(p), "nnserve_ms": ms, "ort_ms": ort_ms, "ratio": ms / ort_ms,
                         "nnserve_cpu_ms": cpu[0], "ort_cpu_ms": cpu[1],
                         "kernels": per_engine["nnserve"][0][i]["kernels"], "rel_err": _rel_err(tmp_dir, i)})
    return sorted(rows, key=lambda row: -row["ratio"] if not math.isnan(row["ratio"]) else -math.inf)


def table(rows: list[dict]) -> str:
    body = [[r["name"], f"{r['nnserve_ms']:.3f}", f"{r['ort_ms']:.3f}", f"{r['ratio']:.2f}",
             f"{r['nnserve_cpu_ms']:.3f} / {r['ort_cpu_ms']:.3f}", f"{r['rel_err']:.1e}", r["kernels"]] for r in rows]
    return markdown_table(["layer", "nnserve ms", "ORT ms", "ratio", "CPU ms nnserve / ORT", "max rel diff",
                           "nnserve kernels"], body)


def summary(rows: list[dict]) -> str:
    ratios = [r["ratio"] for r in rows if r["ratio"] > 0 and math.isfinite(r["ratio"])]
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else math.nan
    over = sum(1 for x in ratios if x > 2.0)
    failed = len(rows) - len(ratios)
    points = f"{len(rows)} points" + (f" ({failed} failed: see the table)" if failed else "")
    return (f"{points}; ratio nnserve/ORT: geomean {geo:.2f}, worst {max(ratios, default=math.nan):.2f}, "
            f"{over} above 2x; outputs differ by at most {max(r['rel_err'] for r in rows):.1e} (relative)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the known cliffs only (a few minutes)")
    ap.add_argument("--rounds", type=int, default=3, help="processes per engine, alternating")
    ap.add_argument("--budget", type=float, default=0.4, help="seconds of timed calls per point and round")
    ap.add_argument("--only", action="append", default=[],
                    help="only points whose name contains this (repeatable: any of them)")
    ap.add_argument("--threads", type=int, default=None,
                    help="both engines' thread count (not their defaults: never the headline figure)")
    ap.add_argument("--record", action="store_true", help="append the table to bench/RESULTS.md")
    ap.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    ap.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--save", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        points = json.loads(args.spec.read_text())
        print(json.dumps(worker(args.worker, points, args.out_dir, args.save, args.budget, args.threads)))
        return
    points = [p for p in (P.quick_points() if args.quick else P.full_points())
              if not args.only or any(s in P.name_of(p) for s in args.only)]
    if not points:
        raise SystemExit(f"no point's name contains any of {args.only!r}")
    _require_peer()
    rows = sweep(points, args.rounds, args.budget, args.threads)
    settings = ("each engine with its default settings" if args.threads is None else
                f"both engines at {args.threads} thread(s), not their defaults: not the headline figure")
    text = f"{settings}; {summary(rows)}\n\n{table(rows)}\n"
    print(text)
    if args.record:
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        append_run("Layers", f"Load average before the table was written: {load}.\n\n{text}")


if __name__ == "__main__":
    main()
