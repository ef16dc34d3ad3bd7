"""Memory bench: activation arena vs naive allocation and the in-place live-bytes bound, next to TNN's and
MIGraphX's figures where they publish one.

    .venv-dev/bin/python bench/memory.py        # the nine models below, batch 1
    .venv-dev/bin/python bench/memory.py alexnet vit_b_16 --no-record

fp32, the bench models of `tools/make_fixtures.py --bench`. "naive" gives every value its own slot; "arena" is
the planned activation arena of one instance, which holds intermediates and outputs (graph inputs are read where
the caller holds them); "bound" is the most bytes live at any one step with in-place reuse, computed from the
instance's step list apart from the planner (tests/engine/runtime/live_bound.py), a lower bound for any arena;
"inputs copied in" is the arena planned with the graph inputs in it as well, as it was before inputs were bound
in place (and as a device that cannot read host memory still plans it). Workspace (im2col/Winograd scratch) and
weights are shown apart, as the published figures count activations. TNN and MIGraphX report their figures
after optimisation.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

# This directory holds bench/engine.py: the repository root must come first or `import engine` finds it.
_BENCH, _ROOT = str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])
_BOUND = str(Path(_ROOT) / "tests" / "engine" / "runtime")  # live_bound.py: the bound the tests assert against
sys.path[:] = [_ROOT, _BENCH, _BOUND] + [p for p in sys.path if p not in (_BENCH, _ROOT, _BOUND, "")]

from _results import append_run, markdown_table  # noqa: E402
from live_bound import live_bound  # noqa: E402

import engine  # noqa: E402
from engine.devices.cpu import CpuDevice  # noqa: E402

MODELS = Path(_ROOT) / "bench" / "models"
MIB = 1024 * 1024
# name -> (label, TNN MiB, MIGraphX MiB): the published figures as issue 5 quotes them, None where there is none
PUBLISHED = {
    "alexnet": ("AlexNet", 1.5, 5.0),
    "mobilenet_v2": ("MobileNetV2", 9.0, 12.0),
    "inception_v3": ("Inception-v3 (299)", 7.0, 5.0),
    "vgg16": ("VGG-16", 25.0, 25.0),
    "resnet50": ("ResNet-50", 10.0, 9.0),
    "mobilenet_v3_small": ("MobileNetV3-Small", None, None),
    "shufflenet_v2_x1_0": ("ShuffleNetV2 x1.0", None, None),
    "vit_b_16": ("ViT-B/16", None, None),
    "resnet18": ("ResNet-18", None, None),
}
BOUND_SLACK = 1.05  # the arena may exceed the peak-live bound by at most 5 %


def measure(name: str, check: bool) -> dict:
    model = engine.load(MODELS / name / "model.pnnx.param")
    inst = model.instance()
    plan = inst.memory_plan
    row = {"name": name, "naive": plan.naive_bytes / MIB, "arena": plan.arena_bytes / MIB,
           "bound": live_bound(inst._compiled, inst.graph) / MIB, "peak": plan.peak_live_bytes / MIB,
           "copied_in": _arena_with_inputs(model) / MIB, "workspace": plan.workspace_bytes / MIB,
           "weights": plan.weights_bytes / MIB, "diff": None}
    if check:  # the arena plan is only worth reporting if the model still computes the right thing in it
        x = np.load(MODELS / name / "input.npy")
        out = next(iter(inst.run({model.inputs[0].name: x}).values()))
        row["diff"] = float(np.abs(out - np.load(MODELS / name / "expected.npy")).max())
    return row


def _arena_with_inputs(model) -> int:
    """The arena of the same instance with the graph inputs planned into it (copied in before each run)."""
    CpuDevice.host_inputs = False
    try:
        return model.instance().memory_plan.arena_bytes
    finally:
        del CpuDevice.host_inputs  # back to Device's


def verdict(row: dict, tnn: float | None) -> str:
    if tnn is None:
        return "-"
    if row["arena"] < tnn:
        return f"below TNN ({row['arena'] / tnn:.2f}x)"
    if row["bound"] >= tnn:
        return f"above TNN; bound does not allow it (bound {row['bound']:.2f} >= {tnn})"
    return f"above TNN by {row['arena'] - tnn:.2f} MiB though the bound ({row['bound']:.2f}) allows below"


def report(rows: list[dict]) -> str:
    header = ["model", "naive MiB", "arena MiB", "bound MiB", "arena/bound", "inputs copied in MiB",
              "its /bound", "workspace MiB", "weights MiB", "TNN MiB", "MIGraphX MiB", "vs TNN",
              "max abs diff vs PyTorch"]
    lines = []
    for r in rows:
        label, tnn, mig = PUBLISHED[r["name"]]
        ratio = r["arena"] / r["bound"]
        lines.append([label, f"{r['naive']:.2f}", f"{r['arena']:.2f}", f"{r['bound']:.2f}",
                      f"{ratio:.3f}{'' if ratio <= BOUND_SLACK else ' (> 1.05)'}", f"{r['copied_in']:.2f}",
                      f"{r['copied_in'] / r['bound']:.3f}", f"{r['workspace']:.2f}", f"{r['weights']:.1f}",
                      "-" if tnn is None else f"{tnn}", "-" if mig is None else f"{mig}", verdict(r, tnn),
                      "-" if r["diff"] is None else f"{r['diff']:.1e}"])
    layout = os.environ.get("NNSERVE_LAYOUT") or "unset (blocked between convolutions where it pays)"
    return (f"Batch 1, fp32, one instance per model, NNSERVE_LAYOUT {layout}. Bound: the in-place live-bytes "
            "bound from the step list (tests/engine/runtime/live_bound.py), graph inputs excluded. Inputs copied "
            "in: the arena with the graph inputs in it, as before inputs were bound in place. TNN/MIGraphX: "
            "published figures after optimisation (issue 5).\n\n" + markdown_table(header, lines))


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
        print(f"{label:<20} naive {row['naive']:8.2f}  arena {row['arena']:7.2f}  bound {row['bound']:7.2f} "
              f"({row['arena'] / row['bound']:.3f}x)  inputs copied in {row['copied_in']:7.2f} "
              f"({row['copied_in'] / row['bound']:.3f}x)  ws {row['workspace']:6.2f}  weights {row['weights']:7.1f} "
              f"MiB | {verdict(row, tnn)}" + ("" if row["diff"] is None else f" | diff {row['diff']:.1e}"), flush=True)
    text = report(rows)
    if not args.no_record:
        append_run("Memory", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
