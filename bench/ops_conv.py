"""Micro-benchmark: Conv kernel vs numpy reference on two typical layers (not a test).

    .venv/bin/python bench/ops_conv.py [--repeat 20] [--batch 1] [--threads N]

(--threads sets the kernels' pool, engine/devices/cpu/threads.py; BLAS runs single-threaded under it.)
Times are wall-clock medians: on a shared machine, run it when nothing else is busy.

Prints the direct path the conv would take (engine/devices/cpu/conv/direct.py; with oneDNN on, most convs run on
oneDNN instead: --onednn 0 times the direct paths), median milliseconds per call and GFLOP/s for a
ResNet-18-like 3x3 conv (64->64 at 56x56, Winograd), the same conv forced onto im2col + GEMM, a
MobileNet-like depthwise 3x3 (32 channels at 112x112), each with bias + ReLU fused, and a 1x1 conv.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, before bench/engine.py

from engine.devices.cpu import CpuDevice, CpuOptions  # noqa: E402
from engine.devices.cpu import threads as _threads  # noqa: E402
from engine.devices.cpu.conv import direct  # noqa: E402
from engine.ir import Node, Value  # noqa: E402
from engine.ops import get_op  # noqa: E402
from engine.ops.conv_geometry import conv_geom  # noqa: E402
from engine.ops.registry import TensorInfo  # noqa: E402

LAYERS = {
    "resnet18 3x3 64->64 @56": dict(c=64, o=64, k=3, hw=56, groups=1),
    "depthwise 3x3 32 @112": dict(c=32, o=32, k=3, hw=112, groups=32),
    "pointwise 1x1 32->64 @112": dict(c=32, o=64, k=1, hw=112, groups=1),
}


def _time(fn, repeat: int) -> float:
    fn()  # warm-up (numba compile / cache load, BLAS threads)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_layer(device: CpuDevice, name: str, c: int, o: int, k: int, hw: int, groups: int, batch: int,
                repeat: int) -> None:
    rng = np.random.default_rng(0)
    pad = k // 2
    node = Node("Conv", "conv", [Value("x")], [Value("y")], {"pads": [pad] * 4, "groups": groups, "activation": "relu"},
                {"weight": rng.standard_normal((o, c // groups, k, k)).astype(np.float32),
                 "bias": rng.standard_normal(o).astype(np.float32)})
    op = get_op("Conv")
    x = rng.standard_normal((batch, c, hw, hw)).astype(np.float32)
    info = [TensorInfo(x.shape, x.dtype)]
    out = np.empty(op.infer(node, info)[0].shape, np.float32)
    ws = np.empty(device.workspace_bytes(node, op, info), np.uint8)
    kernel = device.build_kernel(node, op, info)
    t_kernel = _time(lambda: kernel([x], [out], ws), repeat)
    t_ref = _time(lambda: op.reference(node, [x]), max(1, repeat // 5))
    flops = 2 * out.size * (c // groups) * k * k
    path = direct.kind(conv_geom(node, x.shape))
    print(f"{name:28s} [{path:9s}] batch {batch}: kernel {t_kernel * 1e3:8.2f} ms "
          f"({flops / t_kernel / 1e9:6.1f} GFLOP/s)  reference {t_ref * 1e3:8.2f} ms  "
          f"speed-up {t_ref / t_kernel:6.1f}x  workspace {ws.nbytes / 1024:.0f} KiB")


def bench_im2col(device: CpuDevice, batch: int, repeat: int) -> None:
    """The ResNet layer again with the direct Winograd switched off: the im2col + GEMM baseline."""
    direct.WINOGRAD = False
    try:
        bench_layer(device, "resnet18 3x3 (no Winograd)", batch=batch, repeat=repeat,
                    **LAYERS["resnet18 3x3 64->64 @56"])
    finally:
        direct.WINOGRAD = True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=_threads.get_threads())
    ap.add_argument("--onednn", type=int, choices=[0, 1], default=1, help="0: the direct paths (NNSERVE_ONEDNN=0)")
    args = ap.parse_args()
    _threads.set_threads(args.threads)
    device = CpuDevice(CpuOptions(onednn=bool(args.onednn)))
    for name, cfg in LAYERS.items():
        bench_layer(device, name, batch=args.batch, repeat=args.repeat, **cfg)
    bench_im2col(device, args.batch, args.repeat)


if __name__ == "__main__":
    main()
