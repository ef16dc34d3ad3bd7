"""Serving bench: nnserve vs the KServe Python model server, driven by perf_analyzer over HTTP and gRPC.

    .venv/bin/python bench/serve.py --kserve-python /tmp/kserve-venv/bin/python

KServe goes in a venv of its own (`python -m venv /tmp/kserve-venv && /tmp/kserve-venv/bin/pip install kserve
onnxruntime onnx`); bench/_kserve_server.py wraps ONNX Runtime in a `kserve.Model`. ResNet-18 is the bench
model re-exported with a dynamic batch (bench/models/resnet18/dyn, from bench/_peers.py). Both servers get the
same models: (a) an identity-like model, one ReLU over [1, 16] (pure serving overhead) and (b) ResNet-18,
which nnserve serves with dynamic batching (max_batch_size 8, one instance, max_queue_delay 50 ms with the
adaptive wait: a lone client's request goes at once, and the eight closed-loop clients of c=8 are merged into
batches of eight, where Triton's full wait with a delay short enough for c=1 (2 ms, the earlier setting) split
them into groups of 2-6 that take turns) and KServe one request at a time.
Checks the targets of issue 5 and appends the figures to bench/RESULTS.md ("Serving").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# This directory holds bench/engine.py: the repository root must come first or `import engine` finds it.
_BENCH, _ROOT = str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])
sys.path[:] = [_ROOT, _BENCH] + [p for p in sys.path if p not in (_BENCH, _ROOT, "")]

import _serving as sv  # noqa: E402
from _results import append_run, markdown_table  # noqa: E402

import engine  # noqa: E402

CONCURRENCY = [1, 4, 8, 16]
PROTOCOLS = ["http", "grpc"]
MODELS = ["identity", "resnet18"]  # --models narrows these (and CONCURRENCY, PROTOCOLS) while iterating
START_LOAD = ""
IDENTITY_ENGINE_US = 0.0
RESNET_DELAY_US = 50_000
RESNET_INPUT = Path(_ROOT) / "bench" / "models" / "resnet18" / "input.npy"
IDENTITY_ONNX_SCRIPT = """
import sys, onnx
from onnx import TensorProto, helper
g = helper.make_graph([helper.make_node("Relu", ["in0"], ["out0"])], "identity",
                      [helper.make_tensor_value_info("in0", TensorProto.FLOAT, [1, 16])],
                      [helper.make_tensor_value_info("out0", TensorProto.FLOAT, [1, 16])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 8
onnx.save(m, sys.argv[1])
"""


def identity_engine_us(tmp: Path, iters: int = 2000) -> float:
    """In-process median latency of the identity model at batch 1 (the engine's part of a request)."""
    sv.write_identity(tmp / "engine_identity")
    inst = engine.load(tmp / "engine_identity" / "identity" / "1" / "model.pnnx.param").instance(
        max_shapes={"in0": (1, 16)})
    x = np.zeros((1, 16), np.float32)
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        inst.run({"in0": x})
        times.append(time.perf_counter() - t)
    return statistics.median(times[iters // 10:]) * 1e6


def engine_reference(iters: dict[int, int] | None = None) -> dict:
    """In-process ResNet-18: median and p99 latency at batch 1 (100 runs, so the p99 means something) and
    throughput at batch 8 (one instance each)."""
    iters = iters or {1: 100, 8: 10}
    model = engine.load(sv.RESNET_DYN / "model.pnnx.param")
    x1 = np.load(RESNET_INPUT).astype(np.float32)
    out = {}
    for batch in (1, 8):
        inst = model.instance(max_shapes={"in0": (batch, 3, 224, 224)})
        x = np.ascontiguousarray(np.repeat(x1, batch, axis=0))
        inst.run({"in0": x})
        times = []
        for _ in range(iters[batch]):
            t = time.perf_counter()
            inst.run({"in0": x})
            times.append(time.perf_counter() - t)
        out[batch] = times
    return {"latency_b1_us": statistics.median(out[1]) * 1e6, "p99_b1_us": float(np.percentile(out[1], 99)) * 1e6,
            "throughput_b8": 8 / statistics.median(out[8])}


def sweep(label: str, http: str, grpc: str, tmp: Path, windows: dict[str, int], pid: int) -> dict:
    inputs = {"identity": "zero", "resnet18": str(sv.perf_input_file(np.load(RESNET_INPUT), tmp / "rn.json"))}
    results = {}
    for model in MODELS:
        sv.perf(model, "http", http, 1, 1000, inputs[model])  # warm-up, not recorded
        for protocol in PROTOCOLS:
            for c in CONCURRENCY:
                r = sv.perf(model, protocol, http if protocol == "http" else grpc, c, windows[model], inputs[model],
                            server_pid=pid)
                results[(model, protocol, c)] = r
                print(f"{label:<8} {model:<9} {protocol:<5} c={c:<3} "
                      + (f"{r.throughput:8.1f} infer/s  p50 {r.p50_us / 1e3:7.2f} ms  p99 {r.p99_us / 1e3:7.2f} ms"
                         f"  server CPU {r.server_cpu_us:6.0f} us/req" if not r.error else f"FAILED: {r.error}"),
                      flush=True)
    return results


def run_nnserve(tmp: Path, windows: dict[str, int]) -> dict:
    repo = tmp / "nnserve_repo"
    sv.write_identity(repo)
    if "resnet18" in MODELS:
        sv.write_resnet(repo, "resnet18", batching=True, delay_us=RESNET_DELAY_US, adaptive=True)
    proc, http, grpc = sv.start_nnserve(repo)
    try:
        return sweep("nnserve", http, grpc, tmp, windows, proc.proc.pid)
    finally:
        proc.stop()


def run_kserve(tmp: Path, python: str, windows: dict[str, int]) -> dict:
    import subprocess

    identity = tmp / "identity.onnx"
    subprocess.run([python, "-c", IDENTITY_ONNX_SCRIPT, str(identity)], check=True)
    models = [f"identity={identity}:1,16"]
    if "resnet18" in MODELS:
        models.append(f"resnet18={sv.RESNET_DYN / 'model.onnx'}:1,3,224,224")
    proc, http, grpc = sv.start_kserve(python, models)
    try:
        return sweep("kserve", http, grpc, tmp, windows, proc.proc.pid)
    finally:
        proc.stop()


def ratio(a: sv.PerfResult, b: sv.PerfResult) -> float:
    return a.throughput / b.throughput if a.throughput and b.throughput else float("nan")


def targets(ours: dict, theirs: dict, ref: dict | None, rtt_us: float) -> list[str]:
    lines = []
    for protocol in PROTOCOLS:
        if "identity" in MODELS:
            lines.append(identity_target(ours, theirs, protocol))
            if 1 in CONCURRENCY and IDENTITY_ENGINE_US:
                lines.append(p99_line("identity", ours[("identity", protocol, 1)].p99_us, IDENTITY_ENGINE_US,
                                      rtt_us, protocol))
        if ref is not None and {1, 8, 16} <= set(CONCURRENCY):
            lines += resnet_targets(ours, theirs, ref, rtt_us, protocol)
    return lines


def identity_target(ours: dict, theirs: dict, protocol: str) -> str:
    rs = [ratio(ours[("identity", protocol, c)], theirs.get(("identity", protocol, c), sv.PerfResult()))
          for c in CONCURRENCY]
    ok = all(r >= 2.0 for r in rs)
    return (f"identity {protocol}: nnserve/KServe throughput {', '.join(f'{r:.2f}x' for r in rs)} at c="
            f"{CONCURRENCY} (target >= 2x at every c): {'MET' if ok else 'NOT MET'}")


def resnet_targets(ours: dict, theirs: dict, ref: dict, rtt_us: float, protocol: str) -> list[str]:
    r8 = ratio(ours[("resnet18", protocol, 8)], theirs.get(("resnet18", protocol, 8), sv.PerfResult()))
    t16 = ours[("resnet18", protocol, 16)].throughput
    frac = t16 / ref["throughput_b8"]
    return [f"resnet18 {protocol} c=8: nnserve/KServe {r8:.2f}x (target >= 1.5x): {'MET' if r8 >= 1.5 else 'NOT MET'}",
            f"resnet18 {protocol} c=16 with dynamic batching: {t16:.1f} infer/s = {frac:.2f}x the in-process "
            f"engine at batch 8 ({ref['throughput_b8']:.1f}/s) (target >= 0.8x): {'MET' if frac >= 0.8 else 'NOT MET'}",
            p99_line("resnet18", ours[("resnet18", protocol, 1)].p99_us, ref["latency_b1_us"], rtt_us, protocol),
            p99_line("resnet18", ours[("resnet18", protocol, 1)].p99_us, ref["p99_b1_us"], rtt_us, protocol,
                     "the engine's own p99 in-process (like for like)")]


def p99_line(model: str, p99: float, engine_us: float, rtt_us: float, protocol: str,
             engine_is: str = "the engine's median") -> str:
    bound = engine_us + rtt_us + 1000
    return (f"{model} {protocol} c=1 p99 {p99 / 1e3:.2f} ms vs engine {engine_us / 1e3:.2f} ms ({engine_is}) + RTT "
            f"{rtt_us:.0f} us + 1 ms = {bound / 1e3:.2f} ms: {'MET' if 0 < p99 <= bound else 'NOT MET'}")


def report(ours: dict, theirs: dict, ref: dict | None, rtt_us: float, windows: dict[str, int]) -> str:
    header = ["model", "protocol", "c", "nnserve infer/s", "KServe infer/s", "ratio", "nnserve p50/p99 ms",
              "KServe p50/p99 ms", "server CPU us/req nnserve / KServe"]
    rows = []
    for key, a in ours.items():
        b = theirs.get(key, sv.PerfResult(error="not run"))
        rows.append([key[0], key[1], str(key[2]), a.cell(), b.cell(), f"{ratio(a, b):.2f}",
                     f"{a.p50_us / 1e3:.2f} / {a.p99_us / 1e3:.2f}", f"{b.p50_us / 1e3:.2f} / {b.p99_us / 1e3:.2f}",
                     f"{a.server_cpu_us:.0f} / {b.server_cpu_us:.0f}"])
    resnet = ("; ResNet-18 1 instance, max_batch_size 8, dynamic batching (50 ms max delay, adaptive wait)"
              if "resnet18" in MODELS else "")
    return "\n\n".join([
        f"Load average at the start {START_LOAD}. perf_analyzer (tools/perf_analyzer.sh), sync requests of batch 1, "
        f"windows of {windows['identity']} ms (identity) / {windows['resnet18']} ms (ResNet-18), the last of 3 "
        "windows (stability not enforced: the machine is shared). ResNet-18 input: the bench's real input.npy. "
        f"nnserve: identity 2 instances, no dynamic batching{resnet}. KServe 0.21 (one worker), ONNX Runtime CPU "
        "with intra-op threads = cores, access logging and latency logging off, plus only the model-config route "
        "and rpc perf_analyzer asks for. Server CPU per request: the server process's user + system CPU over a "
        "perf_analyzer run divided by its rate (what the 2 cores, shared with perf_analyzer, pay per request).",
        markdown_table(header, rows),
        (f"In-process engine, ResNet-18: batch 1 median {ref['latency_b1_us'] / 1e3:.2f} ms, p99 "
         f"{ref['p99_b1_us'] / 1e3:.2f} ms (100 runs); batch 8 "
         f"{ref['throughput_b8']:.1f} infer/s. " if ref else "")
        + (f"In-process engine, identity: batch 1 median {IDENTITY_ENGINE_US:.0f} us. " if IDENTITY_ENGINE_US else "")
        + f"Loopback TCP round trip: {rtt_us:.0f} us.",
        "Targets:\n\n" + "\n".join(f"- {t}" for t in targets(ours, theirs, ref, rtt_us))])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kserve-python", default="/tmp/kserve-venv/bin/python",
                    help="python of a venv with kserve, onnxruntime and onnx")
    ap.add_argument("--identity-window-ms", type=int, default=2000)
    ap.add_argument("--resnet-window-ms", type=int, default=10000)
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--models", nargs="+", choices=MODELS, default=MODELS, help="while iterating: fewer models")
    ap.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=PROTOCOLS)
    ap.add_argument("--concurrency", nargs="+", type=int, default=CONCURRENCY)
    ap.add_argument("--no-kserve", action="store_true", help="nnserve only (ratios print as nan)")
    args = ap.parse_args(argv)
    global START_LOAD, IDENTITY_ENGINE_US
    START_LOAD = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    MODELS[:], PROTOCOLS[:], CONCURRENCY[:] = args.models, args.protocols, args.concurrency
    windows = {"identity": args.identity_window_ms, "resnet18": args.resnet_window_ms}
    ref = engine_reference() if "resnet18" in MODELS else None
    rtt = sv.loopback_rtt_us()
    if ref:
        print(f"engine ResNet-18: b1 {ref['latency_b1_us'] / 1e3:.2f} ms (p99 {ref['p99_b1_us'] / 1e3:.2f}), "
              f"b8 {ref['throughput_b8']:.1f} infer/s",
              flush=True)
    print(f"loopback RTT {rtt:.0f} us", flush=True)
    with tempfile.TemporaryDirectory(prefix="nnserve-bench-serve-") as d:
        if "identity" in MODELS:
            IDENTITY_ENGINE_US = identity_engine_us(Path(d))
            print(f"engine identity: b1 {IDENTITY_ENGINE_US:.0f} us", flush=True)
        ours = run_nnserve(Path(d), windows)
        theirs = {} if args.no_kserve else run_kserve(Path(d), args.kserve_python, windows)
    for line in targets(ours, theirs, ref, rtt):
        print(line)
    if not args.no_record:
        append_run("Serving", report(ours, theirs, ref, rtt, windows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
