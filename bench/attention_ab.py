"""In-process alternating A/B of the CPU Attention kernel's grouped path, on PackedAttention inputs (B, T, 3, H, D)
as MobileViT-XXS, DeiT-tiny and Swin's windows have them. Two comparisons (--compare):
- onednn: its GEMMs on numpy/OpenBLAS ("old": built with `group_on_onednn` answering no) against the branch's choice
  ("new": oneDNN batched matmuls where DNN_MIN_SCORES says);
- nogil: the items dispatched from Python ("old": built with NOGIL off) against the nogil path ("new": each
  thread's items in one numba call, cblas_sgemm from numba) where it applies.

    NNSERVE_NUM_THREADS=1 .venv/bin/python bench/attention_ab.py [--compare onednn|nogil] [--rounds 11] [CASE ...]

Each round runs both kernels in turn (which goes first alternates), timed by the process's CPU time (all threads;
waiting for a core another process holds is not counted) and by wall time; medians over the rounds. Both outputs are
checked against the numpy reference first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path[0] = str(Path(__file__).resolve().parents[1])  # this tree's engine package, not bench/engine.py beside us
from engine.devices.cpu import attention as fused  # noqa: E402
from engine.devices.cpu import packed_attention as packed  # noqa: E402
from engine.devices.cpu import threads  # noqa: E402
from engine.devices.cpu.kernel import Backends  # noqa: E402
from engine.devices.cpu.options import CpuOptions  # noqa: E402
from engine.ir import Node  # noqa: E402
from engine.ops.registry import TensorInfo  # noqa: E402
from engine.runtime.options import environment_options  # noqa: E402

CASES = {  # name: (B, T, 3, H, D) at batch 1; batch 8 multiplies B
    "mvit256": (4, 256, 3, 4, 16), "mvit64": (4, 64, 3, 4, 20), "mvit16": (4, 16, 3, 4, 24),
    "deit197": (1, 197, 3, 3, 64), "vit197": (1, 197, 3, 12, 64), "swin49": (64, 49, 3, 3, 32),
    "short16": (1, 16, 3, 8, 64),
}


def build(shape: tuple[int, ...], new: bool, options: CpuOptions, compare: str):
    node = Node("PackedAttention", "attention", [], [], {"scale": None, "is_causal": False})
    ins = [TensorInfo(shape, np.float32)]
    backends = Backends.from_options(options)
    real, nogil = fused.group_on_onednn, fused.NOGIL
    if compare == "onednn":
        fused.NOGIL = False  # both sides' items from Python: numpy's matmul against oneDNN's batched GEMMs
        if not new:
            fused.group_on_onednn = lambda L, S: False
    else:
        fused.NOGIL = new  # read when the kernel is built
    try:
        kernel = packed.build(backends, node, ins)
        workspace = np.empty(packed.KERNELS["PackedAttention"].workspace(backends, node, ins), np.uint8)
    finally:
        fused.group_on_onednn, fused.NOGIL = real, nogil
    return node, kernel, workspace


def measure(name: str, shape: tuple[int, ...], rounds: int, options: CpuOptions, compare: str) -> str:
    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    b, t, _, h, d = shape
    kernels = {new: build(shape, new, options, compare) for new in (False, True)}
    out = np.empty((b, t, h, d), np.float32)
    errs = []
    for node, kernel, workspace in kernels.values():
        kernel([x], [out], workspace)
        ref = packed.reference(node, [x])[0]
        errs.append(float(np.abs(out - ref).max() / np.abs(ref).max()))
    calls = max(2, int(4e6 // (b * h * t * t * d)))
    times: dict[bool, tuple[list[float], list[float]]] = {False: ([], []), True: ([], [])}
    for r in range(rounds):
        for new in ((False, True) if r % 2 else (True, False)):
            _, kernel, workspace = kernels[new]
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(calls):
                kernel([x], [out], workspace)
            times[new][0].append((time.process_time() - c0) / calls * 1e6)
            times[new][1].append((time.perf_counter() - w0) / calls * 1e6)
    (oc, ow), (nc, nw) = ((statistics.median(v) for v in times[k]) for k in (False, True))
    ws = [kernels[k][2].nbytes >> 10 for k in (False, True)]
    return (f"{name:8s} {shape}  cpu {oc:8.1f} -> {nc:8.1f} us ({nc / oc:.2f}x)  wall {ow:8.1f} -> {nw:8.1f} us "
            f"({nw / ow:.2f}x)  max err/ref max {errs[0]:.1e} {errs[1]:.1e}  workspace {ws[0]}K -> {ws[1]}K")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="*", choices=[*CASES, []], help="default: every case")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--compare", choices=["onednn", "nogil"], default="onednn")
    args = p.parse_args()
    options = environment_options().cpu
    # as an instance does: NNSERVE_NUM_THREADS (else the CPUs), the wait policy, BLAS on one thread
    threads.configure(options.threads, options.wait_policy)
    for name in args.cases or CASES:
        for batch in args.batches:
            shape = (CASES[name][0] * batch, *CASES[name][1:])
            print(f"b{batch} " + measure(name, shape, args.rounds, options, args.compare), flush=True)


if __name__ == "__main__":
    main()
