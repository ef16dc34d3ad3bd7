"""Run the real-world model suite (tools/make_realworld.py's exports) on nnserve and write docs/realworld.md.

Every model is loaded and run in its own process (a crash or a hang is recorded, not fatal), at its export
shape, and a dynamic variant at each of its cases on one instance sized once for its max shapes (the arena must be
the same buffer after every case). Outputs are compared with torch's: max abs error and max rel error (abs error
over the output's largest magnitude); rel err <= 1e-3 is `ok`. Time per run is the median over repeated runs.

    python tools/check_realworld.py                          # bench/realworld/ -> docs/realworld.md
    python tools/check_realworld.py --root DIR --doc FILE bert swin
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import engine  # noqa: E402

REL_TOL = 1e-3
MIN_TIMED_RUNS, MAX_TIMED_RUNS, TIMED_SECONDS = 5, 50, 1.0
# An op type as pnnx and the engine spell it: nn.Conv2d, F.gelu, torch.addmm, Tensor.reshape_as, aten::addcmul.
PARAM_LINE = re.compile(r"\S*\.pnnx\.param:(\d+)")
OP_PATTERN = re.compile(r"\b((?:nn|F|torch|Tensor|pnnx|prim|aten)(?:\.|::)[A-Za-z_][A-Za-z_0-9.]*)")


def npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    # The folder is the table's row already: keep the file name, drop the path before it.
    return re.sub(r"\S*/(model\.pnnx\.param)", r"\1", text.split("; supported ops:")[0])


def ops_named(exc: BaseException, param: Path) -> list[str]:
    """The op types an error is about: every unsupported one at load, else the type of the node at the file line
    the message points to, else the first op type the message names."""
    listed = [op for op in getattr(exc, "ops", None) or [getattr(exc, "op_type", None)] if op]
    if listed:
        return listed
    where = PARAM_LINE.search(str(exc))
    lines = param.read_text().splitlines()
    if where and 0 < int(where.group(1)) <= len(lines):
        return ["pnnx:" + lines[int(where.group(1)) - 1].split()[0]]
    return sorted(set(OP_PATTERN.findall(PARAM_LINE.sub("", str(exc)))))[:1]


def compare(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> tuple[float, float, str]:
    """(max abs error, max rel error, what is wrong or ''), over every output."""
    if sorted(got) != sorted(want):
        return float("inf"), float("inf"), f"outputs {sorted(got)} != expected {sorted(want)}"
    worst_abs = worst_rel = 0.0
    for name, w in want.items():
        g = np.asarray(got[name])
        if g.shape != w.shape:
            return float("inf"), float("inf"), f"{name}: shape {g.shape} != torch's {w.shape}"
        if w.dtype.kind in "iub":
            if not np.array_equal(g, w):
                return float("inf"), float("inf"), f"{name}: {int(np.sum(g != w))} of {w.size} values differ"
            continue
        if not np.isfinite(g).all() and np.isfinite(w).all():
            return float("inf"), float("inf"), f"{name}: non-finite values"
        err = float(np.max(np.abs(g.astype(np.float64) - w), initial=0.0))
        scale = max(float(np.max(np.abs(w), initial=0.0)), 1e-6)
        worst_abs, worst_rel = max(worst_abs, err), max(worst_rel, err / scale)
    return worst_abs, worst_rel, ""


def median_run_ms(inst, feeds: dict[str, np.ndarray]) -> float:
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < MAX_TIMED_RUNS and (len(times) < MIN_TIMED_RUNS or time.perf_counter() - start < TIMED_SECONDS):
        t0 = time.perf_counter()
        inst.run(feeds)
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def check_one(folder: Path) -> dict:
    """Load, run and compare one model folder (in this process)."""
    meta = json.loads((folder / "meta.json").read_text())
    result = {"name": folder.name, "family": meta["family"], "variant": meta["variant"], "status": "ok", "error": "",
              "ops": [], "max_abs": None, "max_rel": None, "ms": None}
    if "export_error" in meta:
        return result | {"status": "export failed", "error": meta["export_error"]}
    start = time.perf_counter()
    try:
        model = engine.load(folder / "model.pnnx.param")
        shapes = meta.get("max_shapes")
        inst = model.instance("cpu", max_shapes={k: tuple(v) for k, v in shapes.items()} if shapes else None)
    except engine.EngineError as exc:
        return result | {"status": "refused", "error": f"{type(exc).__name__}: {first_line(exc)}",
                         "ops": ops_named(exc, folder / "model.pnnx.param")}
    result["load_s"] = round(time.perf_counter() - start, 2)
    n_cases = len(meta.get("cases", []))
    cases = [(npz(folder / f"inputs_{k}.npz"), npz(folder / f"expected_{k}.npz")) for k in range(n_cases)]
    cases = cases + cases[:1] if cases else [(npz(folder / "inputs.npz"), npz(folder / "expected.npz"))]
    arena, address = inst.arena, inst.arena.ctypes.data
    worst_abs = worst_rel = 0.0
    for k, (feeds, want) in enumerate(cases):
        try:
            got = inst.run(feeds)
        except engine.EngineError as exc:
            error = f"case {k}: {type(exc).__name__}: {first_line(exc)}"
            return result | {"status": "failed", "error": error, "ops": ops_named(exc, folder / "model.pnnx.param")}
        abs_err, rel_err, what = compare(got, want)
        worst_abs, worst_rel = max(worst_abs, abs_err), max(worst_rel, rel_err)
        shape = [list(a.shape) for a in feeds.values()]
        if what:
            return result | {"status": "wrong", "error": f"case {k} {shape}: {what}"}
        if inst.arena is not arena or inst.arena.ctypes.data != address:
            return result | {"status": "wrong", "error": f"case {k} {shape}: the instance reallocated its arena"}
    result.update(max_abs=worst_abs, max_rel=worst_rel, ms=round(median_run_ms(inst, cases[0][0]), 3),
                  fallback_nodes=len(inst.fallback_nodes))
    if worst_rel > REL_TOL:
        result.update(status="wrong", error=f"max rel error {worst_rel:.3g} > {REL_TOL:g}")
    return result


def check_in_child(folder: Path, timeout: float) -> dict:
    meta = json.loads((folder / "meta.json").read_text())
    base = {"name": folder.name, "family": meta["family"], "variant": meta["variant"], "ops": [], "max_abs": None,
            "max_rel": None, "ms": None}
    try:
        proc = subprocess.run([sys.executable, __file__, "--one", str(folder)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return base | {"status": "crashed", "error": f"no result within {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return base | {"status": "crashed", "error": f"exit {proc.returncode}: {tail[:300]}"}
    return json.loads(lines[-1])


def fmt(value: float | None, spec: str) -> str:
    if value is None:
        return ""
    return "inf" if value == float("inf") else format(value, spec)


def suspects(result: dict, ok_ops: set[str], metas: dict[str, dict]) -> list[str]:
    """Op types of a wrong model that no model which runs right uses: where to look first."""
    ops = set(metas[result["name"]].get("pnnx_ops", {}))
    return sorted(ops - ok_ops)


def render(results: list[dict], metas: dict[str, dict], command: str) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    versions = next((m["versions"] for m in metas.values() if "versions" in m), {})
    lines = [
        "# Real-world models on nnserve",
        "",
        f"Written by `{command}` (`make realworld`) from the exports of `tools/make_realworld.py`: models built",
        "from timm, Hugging Face transformers and ultralytics configs at small sizes with random weights, traced",
        "and converted by pnnx (`inputshape`; also `inputshape2` for the `_dynamic` variants), each compared with",
        "torch's outputs on the same inputs. Library versions: "
        + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
        "",
        f"Status: `ok` is a max rel error <= {REL_TOL:g} (max abs error over the output's largest magnitude);",
        "`wrong` a larger error, a shape mismatch or a reallocated arena; `refused` an error at load; `failed` an",
        "error while running; `crashed` the process died or hung; `export failed` pnnx could not convert the model.",
        "A dynamic variant runs every shape of its `meta.json` `cases` (then the first again) on one instance sized",
        "once for its max shapes, and must keep the same arena buffer throughout. ms/run: median over repeated runs",
        f"at the export (max) shape, one process per model, default settings, on {_cpu_name()} ({_cpus()} CPUs):",
        "a pointer to slow paths, not a benchmark (the machine may be shared; bench/ compares engines).",
        "",
        "Summary: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + f" ({len(results)} models).",
        "",
        "| model | family | shapes | status | max abs err | max rel err | ms/run | first error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        error = r["error"] if len(r["error"]) <= 200 else r["error"][:200] + "..."
        lines.append(f"| {r['name']} | {r['family']} | {shapes(metas[r['name']])} | {r['status']} "
                     f"| {fmt(r['max_abs'], '.2e')} | {fmt(r['max_rel'], '.2e')} | {fmt(r['ms'], '.2f')} "
                     f"| {error.replace('|', '/')} |")
    lines += ["", *render_refusals(results), "", *render_wrong(results, metas), "", *render_pnnx(metas)]
    return "\n".join(lines) + "\n"


def shapes(meta: dict) -> str:
    if meta.get("cases"):
        return f"{meta.get('dynamic', 'dynamic')}: {len(meta['cases'])} shapes"
    return ", ".join("x".join(map(str, e["shape"])) for e in meta["inputs"])


def render_refusals(results: list[dict]) -> list[str]:
    groups: dict[str, list[dict]] = {}
    for r in results:
        if r["status"] in ("refused", "failed", "crashed"):
            for op in r["ops"] or ["(no op named)"]:
                groups.setdefault(op, []).append(r)
    lines = ["## Refusals and failures by op", "",
             "Each op with the models it stops (a model refused for several ops is listed under each).", ""]
    lines += [f"- `{op}` ({len(rs)}): " + ", ".join(f"{r['name']} ({r['status']})" for r in rs)
              for op, rs in sorted(groups.items())] or ["None."]
    failed = [r for r in results if r["status"] in ("failed", "crashed")]
    if failed:
        lines += ["", "Errors while running:", ""] + [f"- {r['name']}: {r['error']}" for r in failed]
    return lines


def render_wrong(results: list[dict], metas: dict[str, dict]) -> list[str]:
    ok_ops = {op for r in results if r["status"] == "ok" for op in metas[r["name"]].get("pnnx_ops", {})}
    lines = ["## Wrong results", ""]
    for r in results:
        if r["status"] == "wrong":
            lines.append(f"- {r['name']}: {r['error']}; ops no `ok` model uses: "
                         f"{', '.join(f'`{o}`' for o in suspects(r, ok_ops, metas)) or 'none'}")
    return lines if len(lines) > 2 else lines + ["None."]


def render_pnnx(metas: dict[str, dict]) -> list[str]:
    """Where pnnx's own generated Python disagrees with torch: an export pnnx got wrong (or a pnnx codegen bug)."""
    lines = ["## Exports pnnx itself gets wrong", "",
             "pnnx writes a Python rendering of the graph it exported (`model_pnnx.py`); on the same inputs it should",
             f"match torch. Where its max rel error is above {REL_TOL:g}, or it does not run, the export (or only its",
             "rendering) is wrong; nnserve must refuse such a model rather than serve the same wrong answer.", ""]
    for name, meta in sorted(metas.items()):
        check = meta.get("pnnx_python_vs_torch")
        if isinstance(check, dict) and check["max_rel_diff"] > REL_TOL:
            lines.append(f"- {name}: pnnx's Python max rel error {check['max_rel_diff']:.3g} against torch")
        elif isinstance(check, str):
            lines.append(f"- {name}: pnnx's Python does not run: {check}")
    failures = [f"- {n}: " + "; ".join(m[k] for k in ("export_error", "onnx_error") if k in m)
                for n, m in sorted(metas.items()) if "export_error" in m or "onnx_error" in m]
    return lines + ["", "Export failures (pnnx, or the ONNX twin):", "", *(failures or ["None."])]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="only these models")
    parser.add_argument("--root", type=Path, default=REPO / "bench" / "realworld", help="the suite's exports")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "realworld.md", help="the report to write")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per model")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # the child process: one folder, JSON out
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(check_one(args.one)))
        return 0
    folders = sorted(p for p in args.root.glob("*/meta.json"))
    if not folders:
        parser.error(f"no models in {args.root}: run tools/make_realworld.py first")
    folders = [p.parent for p in folders if not args.names or p.parent.name in args.names]
    metas = {f.name: json.loads((f / "meta.json").read_text()) for f in folders}
    results = []
    for folder in folders:
        r = check_in_child(folder, args.timeout)
        print(f"{r['name']:<28} {r['status']:<14} rel {fmt(r['max_rel'], '.2e'):>9}  {fmt(r['ms'], '.2f'):>8} ms  "
              f"{r['error'][:150]}", flush=True)
        results.append(r)
    command = "python tools/check_realworld.py" + ("" if not args.names else " " + " ".join(args.names))
    args.doc.write_text(render(results, metas, command))
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
