"""Wait policy: how long the engine's idle threads (our kernel pool and OpenMP's team under oneDNN) spin before they
sleep (NNSERVE_SPIN_US), measured on real-world models under two kinds of traffic, with ONNX Runtime (defaults)
beside them for scale.

    .venv-dev/bin/python bench/wait_policy.py --models ghostnet mobilevit_xxs resnet18 --record
    .venv-dev/bin/python bench/wait_policy.py --spins 0 5 200 --rounds 3

Traffic: `steady` is back-to-back calls (a loaded server); `sporadic` is bursts of a few calls after 0.5 s idle
(a server between requests), the case where the engine's threads have gone to sleep and each burst wakes them.
Each (setting, model, traffic, round) is a process of its own: it loads the model, warms up, then times its calls
and reports, per call, the wall time, the process's CPU time and the threads' voluntary sleeps (context switches
counted by the kernel in /proc), plus the CPU the process burnt while idle between bursts. Rounds alternate the
order of the settings, so drift of the machine hits all of them.
"""

from __future__ import annotations

import argparse
import json
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
from realworld import SUITES, _nnserve, _ort, model_folders  # noqa: E402

SECTION = "Wait policy"
DEFAULT_MODELS = ["ghostnet", "mobilevit_xxs", "resnet18", "efficientformerv2_s0", "deit_tiny"]
IDLE_S = 0.5


def _sleeps() -> int:
    """Voluntary context switches of every thread of this process so far (each a wait that went to sleep)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            for line in open(f"/proc/self/task/{tid}/status"):
                if line.startswith("voluntary_ctxt_switches"):
                    total += int(line.split()[1])
        except OSError:  # the thread ended meanwhile
            pass
    return total


def worker(engine_name: str, folder: Path, traffic: str, calls: int, burst: int) -> dict:
    call, _ = (_nnserve if engine_name == "nnserve" else _ort)(folder)
    for _ in range(5):
        call()
    wall, cpu, sleeps, idle_cpu = [], [], [], 0.0
    while len(wall) < calls:
        if traffic == "sporadic":
            c = time.process_time()
            time.sleep(IDLE_S)
            idle_cpu += time.process_time() - c
        for _ in range(burst if traffic == "sporadic" else calls):
            s, c, t = _sleeps(), time.process_time(), time.perf_counter()
            call()
            wall.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            sleeps.append(_sleeps() - s)
    bursts = max(1, calls // burst) if traffic == "sporadic" else 0
    return {"wall_ms": [1e3 * w for w in wall], "cpu_ms": [1e3 * c for c in cpu], "sleeps": sleeps,
            "idle_cpu_pct": 100 * idle_cpu / (bursts * IDLE_S) if bursts else None}


def run_child(python: str, engine_name: str, spin: str, folder: Path, traffic: str, args) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NNSERVE_", "OMP_", "GOMP_"))}
    if engine_name == "nnserve" and spin != "default":
        env["NNSERVE_SPIN_US"] = spin
    cmd = [python, str(Path(__file__).resolve()), "--worker", engine_name, str(folder), traffic,
           "--calls", str(args.calls), "--burst", str(args.burst)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout, cwd=ROOT)
    if done.returncode != 0:
        return {"error": " | ".join(done.stderr.strip().splitlines()[-2:])[-300:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--suite", type=Path, action="append", help="suite folder (default bench/realworld-full)")
    parser.add_argument("--spins", nargs="*", default=["default", "0", "5", "200"],
                        help="NNSERVE_SPIN_US values to compare ('default': unset)")
    parser.add_argument("--traffic", nargs="*", default=["steady", "sporadic"], choices=["steady", "sporadic"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls", type=int, default=40, help="timed calls per process (default 40)")
    parser.add_argument("--burst", type=int, default=4, help="calls per burst in sporadic traffic (default 4)")
    parser.add_argument("--no-ort", action="store_true", help="leave ONNX Runtime out")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--record", action="store_true", help=f"append the table to bench/RESULTS.md ({SECTION})")
    parser.add_argument("--worker", nargs=3, metavar=("ENGINE", "FOLDER", "TRAFFIC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], Path(args.worker[1]), args.worker[2], args.calls, args.burst)))
        return 0

    venv = ROOT / ".venv" / "bin" / "python"
    ours = str(venv) if venv.exists() else sys.executable
    folders = model_folders(args.suite or SUITES, args.models)
    setups = [("nnserve", s) for s in args.spins] + ([] if args.no_ort else [("ort", "-")])
    load_start = os.getloadavg()
    results: dict[tuple, dict[str, list]] = {}
    for r in range(args.rounds):
        for name, folder in folders.items():
            for traffic in args.traffic:
                order = setups[r % len(setups):] + setups[:r % len(setups)]
                for eng, spin in order:
                    res = run_child(ours if eng == "nnserve" else sys.executable, eng, spin, folder, traffic, args)
                    key = (name, traffic, eng, spin)
                    if "error" in res:
                        print(f"round {r + 1} {name} {traffic} {eng} {spin}: {res['error']}", flush=True)
                        continue
                    acc = results.setdefault(key, {"wall_ms": [], "cpu_ms": [], "sleeps": [], "idle": []})
                    for k in ("wall_ms", "cpu_ms", "sleeps"):
                        acc[k].extend(res[k])
                    if res["idle_cpu_pct"] is not None:
                        acc["idle"].append(res["idle_cpu_pct"])
                    print(f"round {r + 1} {name} {traffic} {eng} spin={spin}: median "
                          f"{statistics.median(res['wall_ms']):.2f} ms", flush=True)
    body = report(results, args, load_start)
    print(body)
    if args.record:
        append_run(SECTION, body)
    return 0


def report(results, args, load_start) -> str:
    rows = []
    for (name, traffic, eng, spin), acc in results.items():
        w = acc["wall_ms"]
        rows.append([name, traffic, "ONNX Runtime (defaults)" if eng == "ort" else f"nnserve spin={spin}",
                     f"{statistics.median(w):.2f}", f"{np.percentile(w, 90):.2f}",
                     f"{statistics.median(acc['cpu_ms']):.2f}", f"{statistics.mean(acc['sleeps']):.1f}",
                     f"{statistics.mean(acc['idle']):.1f}" if acc["idle"] else "-"])
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    head = ["model", "traffic", "engine", "median ms", "p90 ms", "CPU ms/call", "sleeps/call", "idle CPU %"]
    return (f"Load average before: {', '.join(f'{x:.1f}' for x in load_start)}; after: "
            f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}. {args.rounds} rounds, {args.calls} timed calls per "
            f"process; sporadic: bursts of {args.burst} after {IDLE_S} s idle.\n\n" + markdown_table(head, rows))


if __name__ == "__main__":
    raise SystemExit(main())
