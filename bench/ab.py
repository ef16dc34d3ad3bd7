"""Before/after bench: nnserve from two source trees, interleaved one inference at a time.

    git worktree add ../nnserve-before <commit>
    .venv-dev/bin/python bench/ab.py --before ../nnserve-before            # this tree is "after"
    .venv-dev/bin/python bench/ab.py --before ../nnserve-before resnet18 --batches 1 --pairs 50 --no-record
    .venv/bin/python bench/ab.py --before ../nnserve-before --suite bench/realworld-full deit_tiny bert_base

Each tree runs in a worker process of its own (its engine imported from that tree), both with the same bench
models (this tree's bench/models, from `tools/make_fixtures.py --bench`; batch 8 uses the batch-dynamic re-export
of bench/_peers.py), or with `--suite` the real-world suite's exports (every input from its inputs.npz; batch 8
from its batch8/ folder). The driver asks the two workers for one inference in turn, alternating which goes first, so
load from other processes on a shared machine falls on both alike; the verdict is the median of the per-pair
ratios after/before, with the spread of those ratios as the noise. Each inference is timed twice: wall time, and
the worker's CPU time (all its threads), which waiting for a core shared with other processes does not inflate.
Both trees' outputs are compared too.
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import append_run, markdown_table  # noqa: E402

NAMES = ["resnet18", "mobilenet_v2", "squeezenet1_1", "shufflenet_v2_x1_0", "efficientnet_b0"]
ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "bench" / "models"
CLOCKS = ("cpu", "wall")
REPLY = {"wall": 0, "cpu": 1}  # where each clock sits in a worker's reply to "run"


# -- worker: one tree's engine ----------------------------------------------------------------------
def worker(tree: str) -> None:
    # The replies get the real stdout; anything else printing (C libraries included) goes to stderr.
    inbox, outbox = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.path.insert(0, tree)
    import engine  # imported here, not at the top: which tree's engine is the worker's argument
    inst = feeds = None
    while True:
        try:
            cmd, arg = pickle.load(inbox)
        except EOFError:
            return
        if cmd == "load":  # (model file, input file, batch)
            param, x_path, batch = arg
            model = engine.load(param)
            if x_path.endswith(".npz"):  # a suite's inputs by graph input name (as bench/realworld.py feeds them)
                with np.load(x_path) as z:
                    feeds = {k: z[k] for k in z.files}
            else:
                x = np.repeat(np.load(x_path).astype(np.float32), batch, axis=0)
                feeds = {model.inputs[0].name: np.ascontiguousarray(x)}
            inst = model.instance(max_shapes={n: a.shape for n, a in feeds.items()})
            reply = next(iter(inst.run(feeds).values()))  # warm-up; its output goes back for comparison
        else:  # "run": one timed inference, (wall s, CPU s)
            t, c = time.perf_counter(), time.process_time()
            inst.run(feeds)
            reply = (time.perf_counter() - t, time.process_time() - c)
        pickle.dump(reply, outbox)
        outbox.flush()


class Worker:
    def __init__(self, tree: Path):
        env = dict(os.environ, PYTHONPATH=str(tree))
        self.tree = tree
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", str(tree)], cwd=tree, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def ask(self, cmd: str, arg=None):
        assert self.proc.stdin is not None and self.proc.stdout is not None
        pickle.dump((cmd, arg), self.proc.stdin)
        self.proc.stdin.flush()
        return pickle.load(self.proc.stdout)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


# -- driver -----------------------------------------------------------------------------------------
def model_files(name: str, batch: int, suite: Path | None = None) -> tuple[str, str]:
    if suite is not None:  # bench/realworld.py's layout: <model>/ at batch 1, <model>/batch8/ at 8
        src = suite / name if batch == 1 else suite / name / f"batch{batch}"
        if not (src / "model.pnnx.param").exists() or not (src / "inputs.npz").exists():
            raise SystemExit(f"{src} has no model.pnnx.param and inputs.npz: run tools/make_realworld.py")
        return str(src / "model.pnnx.param"), str(src / "inputs.npz")
    src = MODELS / name if batch == 1 else MODELS / name / "dyn"
    if not (src / "model.pnnx.param").exists():
        raise SystemExit(f"{src / 'model.pnnx.param'} is missing: run tools/make_fixtures.py --bench"
                         + ("" if batch == 1 else " and bench/engine.py once (it makes the batch-dynamic export)"))
    return str(src / "model.pnnx.param"), str(MODELS / name / "input.npy")


def compare(before: Worker, after: Worker, name: str, batch: int, pairs: int, suite: Path | None = None) -> dict:
    """One round on one model: medians of each side and of the per-pair ratios, per clock."""
    outs = [w.ask("load", (*model_files(name, batch, suite), batch)) for w in (before, after)]
    times: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    for i in range(pairs):
        order = [("before", before), ("after", after)]
        for side, w in order if i % 2 == 0 else order[::-1]:
            times[side].append(w.ask("run"))
    row = {"diff": float(np.abs(outs[1] - outs[0]).max())}
    for clock in CLOCKS:
        b, a = ([t[REPLY[clock]] for t in times[side]] for side in ("before", "after"))
        row[clock] = (statistics.median(b), statistics.median(a),
                      statistics.median([x / y for x, y in zip(a, b, strict=True)]))
    return row


def combine(rounds: list[dict]) -> dict:
    """A model's rounds together: medians over rounds, and the range of the rounds' ratios."""
    out = {"diff": max(r["diff"] for r in rounds)}
    for clock in CLOCKS:
        ratios = [r[clock][2] for r in rounds]
        out[clock] = (statistics.median(r[clock][0] for r in rounds), statistics.median(r[clock][1] for r in rounds),
                      statistics.median(ratios), min(ratios), max(ratios))
    return out


def cells(row: dict, clock: str) -> list[str]:
    before, after, ratio, lo, hi = row[clock]
    return [f"{before * 1e3:.2f}", f"{after * 1e3:.2f}", f"{ratio:.3f} ({lo:.2f}..{hi:.2f})"]


def report(rows: dict, pairs: dict[int, int], rounds: int, before: Path, suite: Path | None = None) -> str:
    header = ["model", "batch", "CPU before ms", "CPU after ms", "CPU after/before (rounds' range)",
              "wall before ms", "wall after ms", "wall after/before (rounds' range)", "max abs diff of outputs"]
    lines = [[name, str(b), *cells(r, "cpu"), *cells(r, "wall"), f"{r['diff']:.1e}"] for (b, name), r in rows.items()]
    models = f"the models of {suite.name}/" if suite is not None else "bench/models"
    text = (f"nnserve alone on {models}, before = {_head(before)}, after = {_head(ROOT)}; {rounds} rounds of fresh "
            f"worker processes, each {', '.join(f'{n} pairs at batch {b}' for b, n in pairs.items())} (one inference "
            "per tree per pair, alternating which goes first). A round's ratio is the median of its per-pair ratios; "
            "the table gives the median over rounds and their range.\n\n" + markdown_table(header, lines) + "\n")
    for b in sorted(pairs):
        text += f"\n- batch {b}: geomean after/before " + ", ".join(
            f"{clock} {geomean([r[clock][2] for (rb, _), r in rows.items() if rb == b]):.3f}" for clock in CLOCKS)
    return text


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def _head(tree: Path) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    return out.stdout.strip() or str(tree)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help=f"default: {' '.join(NAMES)}; with --suite, every model of the suite")
    ap.add_argument("--before", type=Path, required=True, help="the other source tree (a git worktree)")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--pairs", type=int, default=40, help="pairs at batch 1 (a quarter of them at other batches)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each with fresh worker processes (a process's "
                    "placement on a shared machine can shift its times by tens of percent for its whole life)")
    ap.add_argument("--suite", type=Path, help="models from this suite folder (bench/realworld.py's, e.g. "
                    "bench/realworld-full) instead of bench/models")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    args = ap.parse_args(argv)
    if not args.models:
        args.models = NAMES if args.suite is None else sorted(
            d.name for d in args.suite.iterdir() if (d / "model.pnnx.param").exists())
    batches = [int(b) for b in args.batches.split(",")]
    pairs = {b: args.pairs if b == 1 else max(4, args.pairs // 4) for b in batches}
    found: dict[tuple[int, str], list[dict]] = {(b, name): [] for b in batches for name in args.models}
    for k in range(args.rounds):
        before, after = Worker(args.before.resolve()), Worker(ROOT)
        try:
            for (b, name), rounds in found.items():
                rounds.append(compare(before, after, name, b, pairs[b], args.suite and args.suite.resolve()))
                print(f"round {k + 1} {name:<20} b{b}  " + "  ".join(
                    f"{clock} {r[0] * 1e3:8.2f} -> {r[1] * 1e3:8.2f} ms ({r[2]:.3f}x)"
                    for clock, r in ((c, rounds[-1][c]) for c in CLOCKS)) + f"  diff {rounds[-1]['diff']:.1e}",
                    flush=True)
        finally:
            before.close()
            after.close()
    rows = {key: combine(rounds) for key, rounds in found.items()}
    text = report(rows, pairs, args.rounds, args.before.resolve(), args.suite)
    print(text)
    if not args.no_record:
        append_run("Engine before/after", text)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        sys.exit(main())
