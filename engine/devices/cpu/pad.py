"""CPU kernel of Pad (engine/ops/pad.py): the kept input copied into the output's center, then the borders filled
one axis at a time from the output itself (constant, reflect, edge, circular)."""

from __future__ import annotations

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu.kernel import Backends, CpuKernel
from engine.ir import Node
from engine.ops.pad import crop, pad_mode, pad_plan
from engine.ops.registry import TensorInfo


def _border_sources(mode: str, p: int, e: int, n: int) -> tuple[slice, slice, slice, slice]:
    """(begin slab, its source, end slab, its source) along one axis of the output; n = kept input length."""
    if mode == "reflect":
        stop = p + n - 2 - e
        tail_src = slice(p + n - 2, stop if stop >= 0 else None, -1)
        return slice(0, p), slice(2 * p, p, -1), slice(p + n, p + n + e), tail_src
    if mode == "edge":
        return slice(0, p), slice(p, p + 1), slice(p + n, p + n + e), slice(p + n - 1, p + n)
    return slice(0, p), slice(n, n + p), slice(p + n, p + n + e), slice(p, p + e)


def build_pad(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
    mode = pad_mode(node)
    value = node.params.get("value", 0)

    def run(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        begin, end = pad_plan(node, x.shape)
        src = crop(x, begin, end)
        lo = [max(b, 0) for b in begin]
        hi = [max(e, 0) for e in end]
        center = tuple(slice(p, p + n) for p, n in zip(lo, src.shape, strict=True))
        if mode == "constant" and (any(lo) or any(hi)):
            out.fill(value)
        np.copyto(out[center], src)
        if mode == "constant":
            return
        # Fill one axis at a time: slabs span the whole output on axes already done, the center on the rest.
        for d, (p, e, n) in enumerate(zip(lo, hi, src.shape, strict=True)):
            if not p and not e:
                continue
            head, tail = (slice(None),) * d, center[d + 1:]
            b_dst, b_src, e_dst, e_src = _border_sources(mode, p, e, n)
            if p:
                np.copyto(out[head + (b_dst,) + tail], out[head + (b_src,) + tail])
            if e:
                np.copyto(out[head + (e_dst,) + tail], out[head + (e_src,) + tail])
    return run


KERNELS = {"Pad": CpuKernel(build_pad)}
