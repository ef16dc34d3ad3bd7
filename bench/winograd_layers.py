"""Micro-benchmark: a blocked 3x3 s1 conv on oneDNN's direct kernel against Winograd F(4x4) and F(2x2) (not a test).

    .venv/bin/python bench/winograd_layers.py [--repeat 15] [--batches 1,8]

For each layer (ResNet-18's four stages, SqueezeNet's expand3x3 convs, VGG-style wide layers) it builds the
ConvBlocked kernel three times, with Winograd off (NNSERVE_WINOGRAD=0: direct) and with each Winograd tile size forced
whatever `choose` says, and prints median ms per call, the ratios and the rule's choice. The thresholds in
engine/devices/cpu/conv/winograd_blocked.py (MIN_CHANNELS, MIN_TILES, MIN_WORK, SMALL_MIN_CHANNELS) come from it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for `import engine`

from engine.devices.cpu import CpuDevice, CpuOptions  # noqa: E402
from engine.devices.cpu.conv import winograd_blocked as W  # noqa: E402
from engine.devices.cpu.onednn import objects as onednn  # noqa: E402
from engine.devices.cpu.onednn.blocked import native_block  # noqa: E402
from engine.devices.cpu.threads import get_threads  # noqa: E402
from engine.ir import Node  # noqa: E402
from engine.ops.conv_geometry import conv_geom  # noqa: E402
from engine.ops.registry import TensorInfo  # noqa: E402

# (name, input channels, output channels, spatial size)
LAYERS = [("resnet18 layer1", 64, 64, 56), ("resnet18 layer2", 128, 128, 28), ("resnet18 layer3", 256, 256, 14),
          ("resnet18 layer4", 512, 512, 7), ("squeezenet fire2", 16, 64, 55), ("squeezenet fire4", 32, 128, 27),
          ("squeezenet fire6", 48, 192, 13), ("squeezenet fire8", 64, 256, 13), ("narrow 32->32", 32, 32, 56),
          ("vgg16 conv1_2", 64, 64, 224)]


def _node(c: int, o: int, block: int) -> Node:
    rng = np.random.default_rng(0)
    params = {"stride": (1, 1), "pads": (1, 1, 1, 1), "dilation": (1, 1), "groups": 1, "activation": "relu",
              "activation_params": {}, "src_blocked": True, "dst_blocked": True, "block": block}
    attrs = {"weight": rng.standard_normal((o, c, 3, 3)).astype(np.float32) * 0.05,
             "bias": rng.standard_normal(o).astype(np.float32)}
    return Node("ConvBlocked", "conv", params=params, attrs=attrs)


def _time_ms(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def time_layer(c: int, o: int, hw: int, batch: int, tile: int | None, repeat: int) -> tuple[float, str]:
    """(median ms, the kernel's impl) with Winograd forced to output tiles of `tile` (past W.choose), or off."""
    device = CpuDevice(CpuOptions(winograd=tile is not None))
    op, block = device.ops["ConvBlocked"], native_block()
    node = _node(c, o, block)
    x = np.random.default_rng(1).standard_normal((batch, c // block, hw, hw, block)).astype(np.float32)
    infos = [TensorInfo(x.shape, x.dtype)]
    out = np.empty(op.infer(node, infos)[0].shape, np.float32)
    saved_rule = W.choose
    W.choose = lambda geo, block, threads=1: tile
    try:
        kernel = device.build_kernel(node, op, infos)
        ws = np.zeros(device.workspace_bytes(node, op, infos), np.uint8)
        ms = _time_ms(lambda: kernel([x], [out], ws), repeat)
    finally:
        W.choose = saved_rule
    return ms, kernel.impl


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--batches", default="1,8")
    args = ap.parse_args(argv)
    if not onednn.available():
        print("oneDNN is not installed: nothing to compare")
        return 1
    print("| layer | batch | direct ms | F(4x4) ms | F(2x2) ms | direct/F(4x4) | direct/F(2x2) | rule picks |")
    print("|---|---|---|---|---|---|---|---|")
    block = native_block()
    for batch in (int(b) for b in args.batches.split(",")):
        for name, c, o, hw in LAYERS:
            direct, f4, f2 = (time_layer(c, o, hw, batch, tile, args.repeat)[0] for tile in (None, 4, 2))
            tile = W.choose(conv_geom(_node(c, o, block), (batch, c, hw, hw)), block, get_threads())
            pick = "direct" if tile is None else f"F({tile}x{tile})"
            print(f"| {name} {c}->{o}@{hw} | {batch} | {direct:.2f} | {f4:.2f} | {f2:.2f} | {direct / f4:.2f} | "
                  f"{direct / f2:.2f} | {pick} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
