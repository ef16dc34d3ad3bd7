"""Wait policy: how the engine's idle threads (our kernel pool and OpenMP's team under oneDNN) wait for the next op
(NNSERVE_WAIT_POLICY, NNSERVE_SPIN_US, NNSERVE_RUN_SPIN_US), measured on real-world models under three kinds of
traffic, with ONNX Runtime (defaults) beside them for scale.

    .venv-dev/bin/python bench/wait_policy.py --models ghostnet mobilevit_xxs resnet18 --record
    .venv-dev/bin/python bench/wait_policy.py --spins 0 5 200 run:1000 --rounds 3

The A/B of the two wait policies, `short` (spin 2 us after each op, two pools) against `run` (our kernels on
OpenMP's team, spinning across the gaps between ops), on a quiet machine:

    .venv-dev/bin/python bench/wait_policy.py --spins short run --rounds 4 --record \
        --models ghostnet resnet18 deit_tiny mobilevit_xxs mobilenet_v2

A setting (`--spins`) is `default` (nothing set: the `run` policy), a number (the `short` policy spinning that many
microseconds: NNSERVE_SPIN_US), a policy (`short`, `run`: NNSERVE_WAIT_POLICY), `run:N` (the `run` policy with
NNSERVE_RUN_SPIN_US=N), `threads=N` (NNSERVE_NUM_THREADS), `openmp=gnu` / `openmp=intel` (NNSERVE_OPENMP: which
OpenMP runtime oneDNN runs on), or several joined by commas (`short,threads=1`: the
one-thread baseline). The ratio column is each setting's median over the first setting's, per model and traffic.

Traffic: `steady` is back-to-back calls (a loaded server); `sporadic` is bursts of a few calls after 0.5 s idle
(a server between requests), the case where the engine's threads have gone to sleep and each burst wakes them;
`busy` is back-to-back calls while as many busy-looping processes as the CPUs run beside (a shared or overloaded
host: more runnable threads than cores), where a spinning thread may hold a core the thread it waits for needs.
Each (setting, model, traffic, round) is a process of its own: it loads the model, warms up, then times its calls
and reports, per call, the wall time, the process's CPU time, the threads' voluntary sleeps (context switches
counted by the kernel in /proc) and the time its threads waited, runnable, for a CPU (schedstat), plus the CPU the
process burnt while idle between bursts. Rounds alternate the order of the settings, so drift of the machine hits
all of them.

The CPU wait column (summed over the process's threads) says whether a number measured the engine or the host: on a
quiet host it stays near 0 (0.1-0.3 ms a call on EfficientFormerV2 back to back, 2 cores); beside other runnable
work (another job, even one at nice 19) every hand-over to a partner thread waits for that thread to get a core
back, and the wait grows to several milliseconds a call (5-15 ms on EfficientFormerV2's 12-22 ms, bursts after an
idle pause as well as back to back). Compare settings on rows whose wait is small; where it is not, the traffic
was `busy`, whatever the column `traffic` says.
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
BENCH_MODELS = ROOT / "bench" / "models"  # the CNN five's folders (input.npy, one input): mobilenet_v2 and others
IDLE_S = 0.5
TRAFFIC = ("steady", "sporadic", "busy")
# A busy loop that ends with the worker that started it, even if that one is killed (a timeout).
BUSY_LOOP = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass"


def setting_env(setting: str) -> dict[str, str]:
    """The environment of one `--spins` setting (see the docstring)."""
    env: dict[str, str] = {}
    for part in setting.split(","):
        policy, _, spin = part.partition(":")
        if part == "default":
            continue
        if part.isdigit():  # the `short` policy's spin (the `run` policy, the default, does not read it)
            env["NNSERVE_SPIN_US"] = part
            env.setdefault("NNSERVE_WAIT_POLICY", "short")
        elif part.startswith("threads=") and part.removeprefix("threads=").isdigit():
            env["NNSERVE_NUM_THREADS"] = part.removeprefix("threads=")
        elif part in ("openmp=gnu", "openmp=intel", "openmp=auto"):
            env["NNSERVE_OPENMP"] = part.removeprefix("openmp=")
        elif policy in ("short", "run") and (not spin or spin.isdigit()):
            env["NNSERVE_WAIT_POLICY"] = policy
            env.update({"NNSERVE_RUN_SPIN_US": spin} if spin else {})
        else:
            raise SystemExit(f"unknown setting {part!r}: default, a number, short, run, run:N, threads=N or "
                             "openmp=gnu|intel|auto")
    return env


def _bench_model(folder: Path, engine_name: str):
    """A bench/models folder (model.pnnx.param or model.onnx, input.npy): a call and its first output."""
    x = np.load(folder / "input.npy").astype(np.float32)
    if engine_name != "nnserve":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = len(os.sched_getaffinity(0))
        sess = ort.InferenceSession(str(folder / "model.onnx"), opts, providers=["CPUExecutionProvider"])
        feeds = {sess.get_inputs()[0].name: x}
        return (lambda: sess.run(None, feeds)), None
    sys.path.insert(0, str(ROOT))
    import engine

    model = engine.load(folder / "model.pnnx.param")
    feeds = {model.inputs[0].name: x}
    inst = model.instance("cpu", max_shapes={k: v.shape for k, v in feeds.items()})
    return (lambda: inst.run(feeds)), None


def folders_for(suites: list[Path], names: list[str]) -> dict[str, Path]:
    """The suite folders of `names`, a name the suites lack taken from bench/models when it is there."""
    extra = [n for n in names if not (any((s / n / "inputs.npz").exists() for s in suites))
             and (BENCH_MODELS / n / "input.npy").exists()]
    found = model_folders(suites, [n for n in names if n not in extra]) if len(extra) < len(names) else {}
    found.update({n: BENCH_MODELS / n for n in extra})
    return {n: found[n] for n in names}


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


def _cpu_waits_ns() -> int:
    """Nanoseconds every thread of this process has waited, runnable, for a CPU so far (the second number of
    /proc/<tid>/schedstat): time the host's other work held the cores."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):  # the thread ended meanwhile, or no schedstat here
            pass
    return total


def worker(engine_name: str, folder: Path, traffic: str, calls: int, burst: int) -> dict:
    if (folder / "input.npy").exists():
        call, _ = _bench_model(folder, engine_name)
    else:
        call, _ = (_nnserve if engine_name == "nnserve" else _ort)(folder)
    for _ in range(5):
        call()
    hogs = []
    if traffic == "busy":  # as many busy loops as CPUs: every core has another runnable thread
        hogs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in os.sched_getaffinity(0)]
        time.sleep(0.3)
    try:
        return _timed(call, traffic, calls, burst)
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def _timed(call, traffic: str, calls: int, burst: int) -> dict:
    wall, cpu, sleeps, waits, idle_cpu = [], [], [], [], 0.0
    while len(wall) < calls:
        if traffic == "sporadic":
            c = time.process_time()
            time.sleep(IDLE_S)
            idle_cpu += time.process_time() - c
        for _ in range(burst if traffic == "sporadic" else calls):
            s, q, c, t = _sleeps(), _cpu_waits_ns(), time.process_time(), time.perf_counter()
            call()
            wall.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            waits.append(_cpu_waits_ns() - q)
            sleeps.append(_sleeps() - s)
    bursts = max(1, calls // burst) if traffic == "sporadic" else 0
    return {"wall_ms": [1e3 * w for w in wall], "cpu_ms": [1e3 * c for c in cpu], "sleeps": sleeps,
            "wait_ms": [q / 1e6 for q in waits],
            "idle_cpu_pct": 100 * idle_cpu / (bursts * IDLE_S) if bursts else None}


def run_child(python: str, engine_name: str, spin: str, folder: Path, traffic: str, args) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NNSERVE_", "OMP_", "GOMP_", "KMP_"))}
    if engine_name == "nnserve":
        env.update(setting_env(spin))
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
    parser.add_argument("--spins", nargs="*", default=["short", "run"],
                        help="settings to compare: default (unset), N (the short policy, NNSERVE_SPIN_US=N), short, "
                             "run, run:N, threads=N, or several joined by commas (default: short run)")
    parser.add_argument("--traffic", nargs="*", default=list(TRAFFIC), choices=TRAFFIC)
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
    for spin in args.spins:
        setting_env(spin)  # an unknown setting fails now, not after an hour of rounds
    folders = folders_for(args.suite or SUITES, args.models)
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
                    acc = results.setdefault(key, {"wall_ms": [], "cpu_ms": [], "sleeps": [], "wait_ms": [],
                                                   "idle": []})
                    for k in ("wall_ms", "cpu_ms", "sleeps", "wait_ms"):
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
    first = args.spins[0] if args.spins else None
    for (name, traffic, eng, spin), acc in results.items():
        w = acc["wall_ms"]
        base = results.get((name, traffic, "nnserve", first))
        ratio = statistics.median(w) / statistics.median(base["wall_ms"]) if base else None
        rows.append([name, traffic, "ONNX Runtime (defaults)" if eng == "ort" else f"nnserve spin={spin}",
                     f"{statistics.median(w):.2f}", f"{np.percentile(w, 90):.2f}",
                     f"{ratio:.2f}x" if ratio else "-",
                     f"{statistics.median(acc['cpu_ms']):.2f}", f"{statistics.mean(acc['wait_ms']):.2f}",
                     f"{statistics.mean(acc['sleeps']):.1f}",
                     f"{statistics.mean(acc['idle']):.1f}" if acc["idle"] else "-"])
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    head = ["model", "traffic", "engine", "median ms", "p90 ms", f"/ spin={first}", "CPU ms/call", "CPU wait ms/call",
            "sleeps/call", "idle CPU %"]
    return (f"Load average before: {', '.join(f'{x:.1f}' for x in load_start)}; after: "
            f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}. {args.rounds} rounds, {args.calls} timed calls per "
            f"process; sporadic: bursts of {args.burst} after {IDLE_S} s idle; busy: back to back beside "
            f"{len(os.sched_getaffinity(0))} busy loops.\n\n" + markdown_table(head, rows))


if __name__ == "__main__":
    raise SystemExit(main())
