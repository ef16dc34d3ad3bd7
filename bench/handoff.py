"""Hand-over: what splitting one numba kernel over two threads costs and saves, by the engine's pool
(threads.parallel_for, under each wait policy) against a numba prange loop (numba's OpenMP threading layer, run on
the same libgomp team as oneDNN's), by the kernel's own serial time.

    .venv/bin/python bench/handoff.py [--rounds 3] [--record]

A parallel_for chunk is a Python call on its thread (the engine's pool, or OpenMP's team through a ctypes callback
under the `run` policy), so each worker takes the GIL to start its chunk; a prange loop calls the kernel natively on
every thread, no GIL. Each runs under each policy (OpenMP's spin is the policy's: 2 us or 100 us). What a split
costs here is mostly waking a partner that went to sleep, ~100-300 us on a VM whose idle vCPU halts at once, which
`--gap` shows. The kernel is a scale-and-add over 64K float32 repeated `reps` times (~30-45 us a repetition on one
AVX2 core); `--gap` runs it serially before each timed call, as a model's serial stretches (ops too small to split,
Python between ops) come between two splits. Each policy runs in its own process (the wait policy is the process's),
rounds alternating; medians of 300 calls a size and round.
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

_BENCH, _ROOT = str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])
sys.path[:] = [_ROOT, _BENCH] + [p for p in sys.path if p not in (_BENCH, _ROOT, "")]

from _results import append_run, markdown_table  # noqa: E402

SECTION = "Hand-over"
REPS = (1, 4, 16)
CALLS = 300
N = 1 << 16


def _worker(policy: str, gap: int) -> dict:
    os.environ["NUMBA_THREADING_LAYER"] = "omp"  # the libgomp oneDNN links: one team for both (an error if absent)
    from numba import njit, prange, set_num_threads

    from engine.devices.cpu import threads
    from engine.devices.cpu.kernel import Backends
    from engine.devices.cpu.options import CpuOptions

    options = CpuOptions.from_env({**os.environ, "NNSERVE_WAIT_POLICY": policy})
    if not Backends.from_options(options).onednn:
        raise SystemExit("oneDNN is not loaded: the OpenMP team is what this bench measures")
    threads.configure(options.threads, options.wait_policy)
    set_num_threads(threads.get_threads())

    @njit(nogil=True)
    def kernel(x, reps, lo, hi):
        for _ in range(reps):
            for i in range(lo, hi):
                x[i] = x[i] * np.float32(0.999) + np.float32(0.001)

    @njit(parallel=True, nogil=True)
    def native(bounds, x, reps):
        for i in prange(bounds.shape[0]):
            kernel(x, reps, bounds[i, 0], bounds[i, 1])

    x = np.ones(N, np.float32)
    k = threads.get_threads()
    bounds = np.array([(i * N // k, (i + 1) * N // k) for i in range(k)], np.int64)
    kernel(x, 1, 0, N)
    native(bounds, x, 1)

    def median_us(call) -> float:
        times = []
        for _ in range(CALLS):
            kernel(x, gap, 0, N)  # the serial stretch before the call (untimed): how long the team waited
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6

    out = {}
    for reps in REPS:
        out[reps] = {"serial": median_us(lambda r=reps: kernel(x, r, 0, N)),
                     "parallel_for": median_us(lambda r=reps: threads.parallel_for(kernel, N, 1 << 40, x, r)),
                     "prange": median_us(lambda r=reps: native(bounds, x, r))}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--record", action="store_true", help=f"append the table to bench/RESULTS.md ({SECTION})")
    p.add_argument("--gap", type=int, default=0, help="repetitions of the kernel run serially, untimed, before each "
                   "timed call (4: ~170 us, longer than the `run` policy's 100 us spin) (default 0)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker, args.gap)))
        return
    policies = ["short", "run"]
    runs: dict[str, list[dict]] = {q: [] for q in policies}
    for r in range(args.rounds):
        for q in policies[r % 2:] + policies[:r % 2]:
            done = subprocess.run([sys.executable, __file__, "--worker", q, "--gap", str(args.gap)],
                                  capture_output=True, text=True, timeout=600)
            if done.returncode:
                raise SystemExit(done.stderr)
            runs[q].append({int(k): v for k, v in json.loads(done.stdout.splitlines()[-1]).items()})
            print(f"round {r + 1} {q}: done", flush=True)

    def med(q: str, reps: int, what: str) -> float:
        return statistics.median(run[reps][what] for run in runs[q])

    rows = []
    for reps in REPS:
        serial = statistics.median(run[reps]["serial"] for q in policies for run in runs[q])
        cells = [f"{med(q, reps, what):.0f} ({med(q, reps, what) / serial:.2f}x)"
                 for q in policies for what in ("parallel_for", "prange")]
        rows.append([str(reps), f"{serial:.0f}", *cells])
    # OpenMP's spin is the policy's (GOMP_SPINCOUNT: 2 us under `short`, 100 us under `run`), prange's as well
    table = markdown_table(["reps", "serial us", "parallel_for, short us", "prange, short us", "parallel_for, run us",
                            "prange, run us"], rows)
    body = (f"{args.rounds} rounds, {CALLS} calls a size and round, each after {args.gap} repetitions run serially "
            f"(untimed), medians; ratios are of the serial time (below 1: the split pays).\n\n{table}\n")
    print(body)
    if args.record:
        append_run(SECTION, body)


if __name__ == "__main__":
    main()
