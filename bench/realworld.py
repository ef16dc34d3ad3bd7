"""Real-world models: nnserve against ONNX Runtime and PyTorch eager, each engine alone in its own process with its
shipped defaults, over the models of a suite folder (bench/realworld-full/ from bench/realworld_models.py, the
benchmark sizes; bench/realworld/ from tools/make_realworld.py, the test-fixture sizes).

    python bench/realworld.py                                   # every model there, batch 1 and 8, 3 rounds
    python bench/realworld.py --models bert_base deit_tiny --rounds 5 --record

Run it with an interpreter that has the peers (the `dev` extra: onnxruntime, torch, timm, transformers); nnserve's
own process runs on the repository's .venv (`--nnserve-python`), as users install it.

Method. One process per (engine, model, batch, round), so no engine's threads or caches touch another's: it loads
the model, runs `--warmup` calls, then times calls until `--repeat` of them or `--seconds`, and reports each
call's wall time. Rounds alternate the engines' order, so slow drift of the machine hits all of them; a figure is
the median (and p90) over every timed call of every round. Defaults as shipped: nnserve with no settings
(NNSERVE_* unset), ONNX Runtime with default session options and intra-op threads = the CPUs this process may
use (its spinning pool as shipped), PyTorch eager in inference mode with its default thread count. The nnserve
process also checks its outputs against the suite's torch outputs (rel err: max abs error over the largest
expected magnitude). A model folder holds batch 1; a `batch<B>/` subfolder (static exports at that batch) gives
batch B; a model without one is not run at that batch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _results import append_run, markdown_table  # noqa: E402

SUITES = [ROOT / "bench" / "realworld-full"]
ENGINES = ("nnserve", "ort", "torch")
SECTION = "Real-world models"


# -- one measurement (a child process) -------------------------------------------------------------------------
def _feeds(folder: Path) -> dict[str, np.ndarray]:
    with np.load(folder / "inputs.npz") as z:
        return {k: z[k] for k in sorted(z.files, key=lambda n: int(n.removeprefix("in")))}


def _expected(folder: Path) -> dict[str, np.ndarray]:
    with np.load(folder / "expected.npz") as z:
        return {k: z[k] for k in z.files}


def _rel_err(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> float:
    worst = 0.0
    for name, w in want.items():
        g = np.asarray(got[name], np.float64)
        if g.shape != w.shape:
            return math.inf
        scale = max(float(np.abs(w).max()) if w.size else 0.0, 1e-6)
        worst = max(worst, float(np.abs(g - w).max()) / scale if w.size else 0.0)
    return worst


def _nnserve(folder: Path):
    sys.path.insert(0, str(ROOT))
    import engine

    feeds = _feeds(folder)
    inst = engine.load(folder / "model.pnnx.param").instance("cpu", max_shapes={k: v.shape for k, v in feeds.items()})
    return (lambda: inst.run(feeds)), inst.run(feeds)


def _ort(folder: Path):
    import onnxruntime as ort

    feeds = _feeds(folder)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = len(os.sched_getaffinity(0))
    sess = ort.InferenceSession(str(folder / "model.onnx"), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]

    def call():
        return dict(zip(names, sess.run(None, feeds), strict=True))
    return call, call()


def _torch(folder: Path):
    import torch

    meta = json.loads((folder / "meta.json").read_text())
    model = _torch_model(meta)
    feeds = [torch.from_numpy(a) for a in _feeds(folder).values()]

    def call():
        with torch.inference_mode():
            out = model(*feeds)
        flat = [out] if isinstance(out, torch.Tensor) else list(out)
        return {f"out{i}": t.numpy() for i, t in enumerate(flat)}
    return call, call()


def _torch_model(meta: dict):
    """The suite's torch module, rebuilt by the script that exported it (same seeds, same weights)."""
    generator = meta.get("generator", "")
    if generator == "bench/realworld_models.py":
        import realworld_models

        return realworld_models.build_torch(meta["name"])
    if generator == "tools/make_realworld.py":
        sys.path.insert(0, str(ROOT / "tools"))
        import make_realworld

        spec = next(s for s in make_realworld.SPECS if meta["name"] in (s.name, f"{s.name}_dynamic"))
        return make_realworld.build_model(spec)[0]
    raise SystemExit(f"no torch builder for models made by {generator!r}")


def worker(engine_name: str, folder: Path, warmup: int, repeat: int, seconds: float) -> dict:
    make = {"nnserve": _nnserve, "ort": _ort, "torch": _torch}[engine_name]
    t0 = time.perf_counter()
    call, first = make(folder)
    load_s = time.perf_counter() - t0
    for _ in range(warmup):
        call()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeat and (len(times) < 3 or time.perf_counter() - start < seconds):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return {"times_ms": [1e3 * t for t in times], "load_s": load_s, "rel_err": _rel_err(first, _expected(folder))}


# -- the driver ---------------------------------------------------------------------------------------------------
def model_folders(suites: list[Path], names: list[str] | None) -> dict[str, Path]:
    found = {}
    for suite in suites:
        for p in sorted(suite.glob("*/model.pnnx.param")):
            folder = p.parent
            if (folder / "model.onnx").exists() and (folder / "inputs.npz").exists():
                found.setdefault(folder.name, folder)
    if names:
        missing = sorted(set(names) - set(found))
        if missing:
            raise SystemExit(f"not in {', '.join(map(str, suites))}: {', '.join(missing)}")
        found = {n: found[n] for n in names}
    return found


def at_batch(folder: Path, batch: int) -> Path | None:
    if batch == 1:
        return folder
    sub = folder / f"batch{batch}"
    return sub if (sub / "model.pnnx.param").exists() else None


def run_child(python: str, engine_name: str, folder: Path, args: argparse.Namespace) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NNSERVE_", "OMP_", "GOMP_"))}
    cmd = [python, str(Path(__file__).resolve()), "--worker", engine_name, str(folder), "--warmup", str(args.warmup),
           "--repeat", str(args.repeat), "--seconds", str(args.seconds)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout, cwd=ROOT)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-2:])
        return {"error": f"exit {done.returncode}: {tail[-300:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def geomean(values: list[float]) -> float:
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else math.nan


def cpu_description() -> str:
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout if _has("lscpu") else ""
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Model name")), "")
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("Flags")), [])
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model or 'unknown CPU'}, {len(os.sched_getaffinity(0))} CPUs, {isa}"


def _has(tool: str) -> bool:
    return any((Path(d) / tool).exists() for d in os.environ.get("PATH", "").split(os.pathsep))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", type=Path, action="append", help="a suite folder (repeatable; default "
                        "bench/realworld-full)")
    parser.add_argument("--models", nargs="*", help="only these models (folder names)")
    parser.add_argument("--batch", type=int, nargs="*", default=[1, 8], help="batch sizes (default 1 8)")
    parser.add_argument("--engines", nargs="*", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of separate processes (default 3)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls per process (default 5)")
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per process (default 20)")
    parser.add_argument("--seconds", type=float, default=10.0, help="stop timing a process after this long "
                        "(at least 3 calls; default 10)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds before a process is given up")
    parser.add_argument("--nnserve-python", default=None, help="interpreter for nnserve's processes (default: "
                        "the repository's .venv, else this one)")
    parser.add_argument("--record", action="store_true", help=f"append the table to bench/RESULTS.md ({SECTION})")
    parser.add_argument("--worker", nargs=2, metavar=("ENGINE", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], Path(args.worker[1]), args.warmup, args.repeat, args.seconds)))
        return 0

    venv = ROOT / ".venv" / "bin" / "python"
    pythons = {"nnserve": args.nnserve_python or (str(venv) if venv.exists() else sys.executable),
               "ort": sys.executable, "torch": sys.executable}
    folders = model_folders(args.suite or SUITES, args.models)
    load_start = os.getloadavg()
    samples: dict[tuple[str, int, str], list[float]] = {}
    errs: dict[tuple[str, int, str], str] = {}
    rel: dict[tuple[str, int], float] = {}
    for r in range(args.rounds):
        for name, folder in folders.items():
            for batch in args.batch:
                sub = at_batch(folder, batch)
                if sub is None:
                    continue
                order = args.engines[r % len(args.engines):] + args.engines[:r % len(args.engines)]
                for eng in order:
                    res = run_child(pythons[eng], eng, sub, args)
                    key = (name, batch, eng)
                    if "error" in res:
                        errs[key] = res["error"]
                        print(f"round {r + 1} {name} b{batch} {eng}: {res['error']}", flush=True)
                        continue
                    samples.setdefault(key, []).extend(res["times_ms"])
                    if eng == "nnserve":
                        rel[(name, batch)] = max(rel.get((name, batch), 0.0), res["rel_err"])
                    print(f"round {r + 1} {name} b{batch} {eng}: median {statistics.median(res['times_ms']):.2f} ms",
                          flush=True)
    body = report(folders, args, samples, errs, rel, load_start)
    print(body)
    if args.record:
        append_run(SECTION, body)
    return 0


def report(folders, args, samples, errs, rel, load_start) -> str:
    rows, ratios = [], {(b, e): [] for b in args.batch for e in ("ort", "torch")}
    for name in folders:
        for batch in args.batch:
            key = {e: (name, batch, e) for e in args.engines}
            if not any(k in samples or k in errs for k in key.values()):
                continue
            med = {e: statistics.median(samples[k]) if k in samples else math.nan for e, k in key.items()}
            p90 = {e: percentile(samples.get(k, []), 90) for e, k in key.items()}
            cells = [name, str(batch)]
            for e in args.engines:
                cells.append(f"{med[e]:.2f} / {p90[e]:.2f}" if math.isfinite(med[e]) else "error")
            for peer in ("ort", "torch"):
                if peer in args.engines and "nnserve" in args.engines:
                    ratio = med["nnserve"] / med[peer] if med[peer] > 0 else math.nan
                    ratios[(batch, peer)].append(ratio)
                    cells.append(f"{ratio:.2f}x" if math.isfinite(ratio) else "-")
            err = rel.get((name, batch))
            cells.append(f"{err:.1e}" if err is not None else "-")
            rows.append(cells)
    header = ["model", "batch", *(f"{e} ms (median / p90)" for e in args.engines)]
    header += [f"nnserve/{p}" for p in ("ort", "torch") if p in args.engines and "nnserve" in args.engines]
    header.append("rel err vs torch")
    lines = [f"CPU: {cpu_description()}; load average at the start {', '.join(f'{x:.1f}' for x in load_start)}",
             "", f"{args.rounds} rounds of one process per engine, model and batch (engines alternating), "
             f"{args.warmup} warm-up and up to {args.repeat} timed calls each; shipped defaults for every engine.",
             "", markdown_table(header, rows), ""]
    for (batch, peer), vals in ratios.items():
        if vals:
            worst = max(vals)
            lines.append(f"- batch {batch}: geomean nnserve/{peer} {geomean(vals):.2f}x over {len(vals)} models "
                         f"(worst {worst:.2f}x)")
    for (name, batch, eng), msg in sorted(errs.items()):
        lines.append(f"- {name} batch {batch} {eng}: {msg}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
