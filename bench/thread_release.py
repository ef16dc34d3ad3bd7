"""Letting idle kernel threads go (engine.release_thread): a model loaded and warmed up on one thread and run on
another, as a server does, with the loader's OpenMP team kept or let go (not a test).

    .venv/bin/python bench/thread_release.py                                  # appends to bench/RESULTS.md
    .venv/bin/python bench/thread_release.py --model bench/models/mobilenet_v2/int8/int8_b1.tnnproto --no-record
    git worktree add ../nnserve-before <commit>
    .venv/bin/python bench/thread_release.py --server-before ../nnserve-before    # the server, before/after

Each thread that ran kernels keeps an OpenMP team; libgomp counts all teams' threads, idle ones included, and once
they outnumber the CPUs it cuts every team's spin between ops to 2-3 us (engine/devices/cpu/threads.py,
release_thread). The effect is process-wide, so the two cases cannot share a process: each round starts one worker
process per case (the order alternating between rounds, so drift hits both), which loads the model on a loader
thread, runs it there a few times (the warm-up), lets that thread's team go or not, then times back-to-back runs on
a second thread. Reported: the median and p90 over all rounds' runs per case, and the ratio of medians.

`--server-before TREE` measures the server instead: one nnserve from TREE and one from this tree, both serving the
same repository (the models above, each with a 3-run model_warmup), both started before any request; a client sends
one HTTP request (tritonclient, batch 1, binary tensors) to each in turn, first to one model, then to the next, and
reports each server's median, p90 and the median of the per-pair ratios this / TREE.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # the engine package before bench/engine.py
from _results import append_run, markdown_table  # noqa: E402

CASES = ("kept", "released")
DEFAULT_MODELS = ["bench/models/mobilenet_v2/int8/int8_b1.tnnproto",
                  "bench/realworld-full/efficientformerv2_s0/model.pnnx.param"]


def worker(model: str, case: str, runs: int) -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    import engine

    loader, server = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
    keep_loader = threading.Event()  # the loader thread stays, as a server's does

    def load():
        inst = engine.load(model).instance("cpu")
        rng = np.random.default_rng(0)
        feeds = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in inst.graph.inputs}
        for _ in range(3):  # the warm-up, on the loader
            inst.run(feeds)
        if case == "released":
            engine.release_thread()
        return inst, feeds

    inst, feeds = loader.submit(load).result()
    loader.submit(keep_loader.wait)

    def serve():
        for _ in range(10):
            inst.run(feeds)
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            inst.run(feeds)
            times.append(1e3 * (time.perf_counter() - t))
        return times

    print(json.dumps(server.submit(serve).result()))
    keep_loader.set()


def measure(model: str, rounds: int, runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {c: [] for c in CASES}
    for r in range(rounds):
        for case in CASES if r % 2 == 0 else CASES[::-1]:
            out = subprocess.run([sys.executable, __file__, "--worker", model, case, str(runs)], cwd=ROOT,
                                 capture_output=True, text=True, check=True)
            times[case] += json.loads(out.stdout.strip().splitlines()[-1])
    return times


WARMUP = ('model_warmup [{{ name: "w" batch_size: 1 count: 3 inputs {{ key: "{name}" value {{ data_type: TYPE_FP32 '
          'dims: {dims} random_data: true }} }} }}]\n')


def server_repository(root: Path, models: list[str]) -> list[tuple[str, str, list[int]]]:
    """The models imported into `root` (nnserve import: config auto-complete), each given a warm-up; their names,
    inputs and shapes."""
    import engine

    served = []
    for model in models:
        folders = [p for p in Path(model).parent.parts if p not in ("bench", "models", "realworld-full")]
        name = "_".join(folders)  # mobilenet_v2_int8, efficientformerv2_s0
        subprocess.run([sys.executable, "-m", "server.cli", "import", "--repository", str(root), "--name", name,
                        str(ROOT / model)], cwd=ROOT, check=True, capture_output=True)
        (inp,) = engine.load(ROOT / model).inputs  # one image input: what these bench models take
        config = root / name / "config.pbtxt"
        config.write_text(config.read_text() + WARMUP.format(name=inp.name, dims=list(inp.shape[1:])))
        served.append((name, inp.name, [1, *inp.shape[1:]]))
    return served


def serve_ab(before: Path, models: list[str], pairs: int) -> list[list[str]]:
    import tempfile

    import numpy as np
    import tritonclient.http as http
    from _serving import start_nnserve

    rows = []
    with tempfile.TemporaryDirectory(prefix="nnserve-release-") as tmp:
        served = server_repository(Path(tmp), models)
        procs = [start_nnserve(Path(tmp), tree=tree) for tree in (before, ROOT)]
        try:
            clients = [http.InferenceServerClient(url) for _, url, _ in procs]
            for name, input_name, shape in served:
                x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
                inp = http.InferInput(input_name, shape, "FP32")
                inp.set_data_from_numpy(x, binary_data=True)
                times: list[list[float]] = [[], []]
                for i in range(pairs + 20):
                    for k in (0, 1) if i % 2 == 0 else (1, 0):
                        t = time.perf_counter()
                        clients[k].infer(name, [inp])
                        if i >= 20:  # the first 20 pairs warm the clients' connections
                            times[k].append(1e3 * (time.perf_counter() - t))
                ratios = sorted(b / a for a, b in zip(*times, strict=True))
                rows.append([name, *(f"{statistics.median(t):.2f} / {sorted(t)[int(0.9 * len(t))]:.2f}"
                                     for t in times), f"{statistics.median(ratios):.2f}x "
                             f"({ratios[len(ratios) // 4]:.2f}-{ratios[3 * len(ratios) // 4]:.2f})"])
                print(rows[-1], flush=True)
        finally:
            for proc, _, _ in procs:
                proc.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="model file (repeatable); default: MobileNetV2 int8 and "
                    "EfficientFormerV2 from bench/models and bench/realworld-full")
    ap.add_argument("--rounds", type=int, default=6, help="worker processes per case, alternating")
    ap.add_argument("--runs", type=int, default=100, help="timed runs per worker")
    ap.add_argument("--server-before", type=Path, help="a source tree to serve against this one (see above)")
    ap.add_argument("--pairs", type=int, default=300, help="request pairs per model with --server-before")
    ap.add_argument("--no-record", action="store_true", help="print only, do not append to bench/RESULTS.md")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1], int(args.worker[2]))
        return
    models = []
    for model in args.model or DEFAULT_MODELS:
        if (ROOT / model).exists():
            models.append(model)
        else:
            print(f"skipped {model}: not found (tools/make_fixtures.py --bench, bench/realworld_models.py)")
    if args.server_before:
        before = subprocess.run(["git", "-C", str(args.server_before), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip() or args.server_before.name
        rows = serve_ab(args.server_before.resolve(), models, args.pairs)
        table = markdown_table(["model", "before: ms (median / p90)",
                                "this tree: ms (median / p90)", "this / before (median ratio, quartiles)"], rows)
        print(table)
        if not args.no_record and rows:
            append_run("Wait policy", f"Two servers (before: {before}; after: this tree), the same "
                       f"repository of {len(rows)} models with a 3-run model_warmup each; {args.pairs} request "
                       "pairs per model, one server then the other, alternating who goes first.\n\n" + table)
        return
    rows = []
    for model in models:
        t = measure(model, args.rounds, args.runs)
        med = {c: statistics.median(t[c]) for c in CASES}
        p90 = {c: sorted(t[c])[int(0.9 * len(t[c]))] for c in CASES}
        rows.append([model, *(f"{med[c]:.2f} / {p90[c]:.2f}" for c in CASES), f"{med['released'] / med['kept']:.2f}x"])
        print(rows[-1], flush=True)
    table = markdown_table(["model", "loader's team kept: ms (median / p90)", "let go: ms (median / p90)",
                            "let go / kept"], rows)
    print(table)
    if not args.no_record and rows:
        append_run("Wait policy", f"{args.rounds} rounds of one process per case (alternating), {args.runs} timed "
                   "runs each on a serving thread after a 3-run warm-up on a loader thread that stays alive.\n\n"
                   + table)


if __name__ == "__main__":
    main()
