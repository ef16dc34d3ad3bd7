"""Memory bench: activation arena vs naive allocation and the peak-live bound, next to TNN's and MIGraphX's figures.

    .venv/bin/python bench/memory.py            # AlexNet, MobileNetV2, Inception-v3 (299), VGG-16, ResNet-50
    .venv/bin/python bench/memory.py --no-record

Batch 1, fp32, the bench models of `tools/make_fixtures.py --bench`. "naive" gives every value its own slot;
"arena" is the planned activation arena of one instance; "peak live" is the most bytes live at any one step
with in-place reuse, a lower bound for any arena. Workspace (im2col/Winograd scratch) and weights are shown
apart, as the published figures count activations. TNN and MIGraphX report their figures after optimisation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

# This directory holds bench/engine.py: the repository root must come first or `import engine` finds it.
_BENCH, _ROOT = str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])
sys.path[:] = [_ROOT, _BENCH] + [p for p in sys.path if p not in (_BENCH, _ROOT, "")]

from _results import append_run, markdown_table  # noqa: E402

import engine  # noqa: E402

MODELS = Path(_ROOT) / "bench" / "models"
MIB = 1024 * 1024
# name -> (label, TNN MiB, MIGraphX MiB), as issue 5 quotes them
PUBLISHED = {
    "alexnet": ("AlexNet", 1.5, 5.0),
    "mobilenet_v2": ("MobileNetV2", 9.0, 12.0),
    "inception_v3": ("Inception-v3 (299)", 7.0, 5.0),
    "vgg16": ("VGG-16", 25.0, 25.0),
    "resnet50": ("ResNet-50", 10.0, 9.0),
}
BOUND_SLACK = 1.05  # the arena may exceed the peak-live bound by at most 5 %


def measure(name: str, check: bool) -> dict:
    model = engine.load(MODELS / name / "model.pnnx.param")
    inst = model.instance()
    plan = inst.memory_plan
    row = {"name": name, "naive": plan.naive_bytes / MIB, "arena": plan.arena_bytes / MIB,
           "peak": plan.peak_live_bytes / MIB, "workspace": plan.workspace_bytes / MIB,
           "weights": plan.weights_bytes / MIB, "diff": None}
    if check:  # the arena plan is only worth reporting if the model still computes the right thing in it
        x = np.load(MODELS / name / "input.npy")
        out = next(iter(inst.run({model.inputs[0].name: x}).values()))
        row["diff"] = float(np.abs(out - np.load(MODELS / name / "expected.npy")).max())
    return row


def verdict(row: dict, tnn: float) -> str:
    if row["arena"] < tnn:
        return f"below TNN ({row['arena'] / tnn:.2f}x)"
    if row["peak"] >= tnn:
        return f"above TNN; bound does not allow it (peak live {row['peak']:.2f} >= {tnn})"
    return f"above TNN by {row['arena'] - tnn:.2f} MiB though the bound ({row['peak']:.2f}) allows below"


def report(rows: list[dict]) -> str:
    header = ["model", "naive MiB", "arena MiB", "peak-live bound MiB", "arena/bound", "workspace MiB",
              "weights MiB", "TNN MiB", "MIGraphX MiB", "vs TNN", "max abs diff vs PyTorch"]
    lines = []
    for r in rows:
        label, tnn, mig = PUBLISHED[r["name"]]
        ratio = r["arena"] / r["peak"]
        lines.append([label, f"{r['naive']:.2f}", f"{r['arena']:.2f}", f"{r['peak']:.2f}",
                      f"{ratio:.3f}{'' if ratio <= BOUND_SLACK else ' (> 1.05)'}", f"{r['workspace']:.2f}",
                      f"{r['weights']:.1f}", f"{tnn}", f"{mig}", verdict(r, tnn),
                      "-" if r["diff"] is None else f"{r['diff']:.1e}"])
    return ("Batch 1, fp32, one instance per model. TNN/MIGraphX: published figures after optimisation "
            "(issue 5).\n\n" + markdown_table(header, lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(PUBLISHED))
    ap.add_argument("--no-check", action="store_true", help="skip running each model against expected.npy")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    args = ap.parse_args(argv)
    rows = []
    for name in args.models:
        row = measure(name, not args.no_check)
        rows.append(row)
        label, tnn, mig = PUBLISHED[name]
        print(f"{label:<20} naive {row['naive']:8.2f}  arena {row['arena']:7.2f}  bound {row['peak']:7.2f}  "
              f"ws {row['workspace']:6.2f}  weights {row['weights']:7.1f} MiB | TNN {tnn} MIGraphX {mig} | "
              f"{verdict(row, tnn)}" + ("" if row["diff"] is None else f" | diff {row['diff']:.1e}"), flush=True)
    text = report(rows)
    if not args.no_record:
        append_run("Memory", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
