"""Winograd F(4x4, 3x3) for plain (NCHW) convolutions: the blocked Winograd of winograd_blocked.py between two
reorders of the conv's own, in its workspace (its input, and residual, to nChw{B}c; the output back to NCHW).

A 3x3 conv stays plain where the layout rewrite leaves it (one conv between ops that want NCHW, or a graph whose
reorders would not pay). oneDNN's plain path reorders as well (its primitive picks NHWC and `brgconv`), so the
copies are the same and the multiply-adds 4x fewer. In-process A/B on an AVX2 EPYC, 2 vCPUs, batch 1, oneDNN's
plain conv -> this, 1 / 2 threads: 64->64 @56 0.47 / 0.55, 128->128 @28 0.42 / 0.54, 256->256 @14 0.63 / 0.78,
32->64 @56 0.68 / 0.75, 96->48 @32 0.70 / 0.77, 64->128 @56 0.46 / 0.51, 32->32 @112 0.68 / 0.68. F(2x2) does not
pay here (512->512 @7: 1.10 / 0.97): only the shapes W.choose gives F(4x4) take it; the rest, and any smaller
input shape the rule turns down, run oneDNN's plan.

Non-finite inputs behave as in winograd_blocked.py (NaN over whole tiles, never a wrong finite number).
"""

from __future__ import annotations

import math

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu.conv import onednn
from engine.devices.cpu.conv import winograd_blocked as W
from engine.devices.cpu.conv.blocked import aligned_workspace
from engine.devices.cpu.kernel import Backends, remember
from engine.devices.cpu.layout.kernels import reorder
from engine.devices.cpu.layout.rewrite import physical
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.onednn.blocked import native_block
from engine.devices.cpu.threads import get_threads
from engine.errors import KernelError
from engine.ir import Node
from engine.ops.conv_geometry import ConvGeom, conv_geom
from engine.ops.registry import TensorInfo

_F32 = np.dtype(np.float32)


def _tile(geo: ConvGeom, block: int) -> int | None:
    """4 where this shape runs F(4x4) here, else None (oneDNN's plan)."""
    if not W.eligible(geo, block, True, True):
        return None
    return 4 if W.choose(geo, block, get_threads()) == 4 else None


def applies(backends: Backends, node: Node, ins: list[TensorInfo]) -> bool:
    """Whether a float32 Conv that oneDNN would run takes this path at its max shape (Winograd on, a blocked layout
    on this CPU, F(4x4) by W.choose)."""
    block = native_block()
    if not (backends.winograd and block and np.dtype(ins[0].dtype) == _F32 and len(ins[0].shape) == 4):
        return False
    return _tile(conv_geom(node, tuple(ins[0].shape)), block) is not None


class _Layout:
    """Where the blocked copies of one input shape sit in the workspace (each ALIGN-aligned), and its Winograd."""

    def __init__(self, geo: ConvGeom, block: int, residual: bool, conv: W.WinogradConv):
        self.geo, self.conv = geo, conv
        self.x_shape = physical((geo.n, geo.c, geo.h, geo.w), block)
        self.y_shape = physical(geo.out_shape, block)
        sizes = [4 * math.prod(self.x_shape), 4 * math.prod(self.y_shape), 4 * math.prod(self.y_shape) if residual
                 else 0, conv.workspace_bytes(geo)]
        self.offsets, at = [], 0
        for size in sizes:
            self.offsets.append(at)
            at += D.aligned(size)
        self.nbytes = at

    def views(self, buf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The blocked input, output and residual, and the Winograd's scratch, in `buf` (ALIGN-aligned uint8)."""
        x_at, y_at, z_at, w_at = self.offsets

        def view(at: int, shape: tuple) -> np.ndarray:
            return buf[at:at + 4 * math.prod(shape)].view(np.float32).reshape(shape)
        return view(x_at, self.x_shape), view(y_at, self.y_shape), view(z_at, self.y_shape), buf[w_at:]


def _winograd(node: Node, ins: list[TensorInfo]) -> tuple[onednn.ConvSpec, int, W.WinogradConv]:
    """The conv's spec, this CPU's block, and its F(4x4) (filters transformed only when prepared)."""
    spec, block = onednn.ConvSpec(node, len(ins) > 1), native_block()
    return spec, block, W.WinogradConv(spec.w, spec.bias, *spec.act, m=4, block=block)


def workspace(backends: Backends, node: Node, ins: list[TensorInfo]) -> int:
    """The larger of the max shape's Winograd layout and oneDNN's plan (smaller shapes may take the latter), plus
    room to align the start."""
    spec, block, conv = _winograd(node, ins)
    layout = _Layout(conv_geom(node, tuple(ins[0].shape)), block, spec.residual, conv)
    return max(layout.nbytes + D.ALIGN, onednn.workspace(spec, ins))


def build(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
    spec, block, conv = _winograd(node, ins)
    max_shape = tuple(ins[0].shape)
    # oneDNN's kernel for the shapes the rule turns down (a smaller batch or map), built now with its weights so
    # that no request builds it
    fallback = onednn.build(spec, ins)
    to_blocked, to_plain = reorder(True, True, block, _F32), reorder(True, False, block, _F32)
    layouts: dict[tuple, _Layout | None] = {}
    private: list[np.ndarray] = []

    def layout(shape: tuple) -> _Layout | None:
        if shape not in layouts:
            geo = conv_geom(node, shape)
            return remember(layouts, shape, None if _tile(geo, block) is None else
                            _Layout(geo, block, spec.residual, conv))
        return layouts[shape]

    def run(inputs, outputs, workspace):
        x = np.ascontiguousarray(inputs[0])
        if any(a > b for a, b in zip(x.shape, max_shape, strict=True)):
            raise KernelError(f"{node.where()}: Conv input {x.shape} is beyond the max shape {max_shape} its "
                              f"workspace was planned for")
        at = layout(x.shape)
        if at is None:
            fallback(inputs, outputs, workspace)
            return
        D.sync_threads()
        xb, yb, zb, scratch = at.views(aligned_workspace(workspace, at.nbytes, private))
        to_blocked([x], [xb], None)
        if spec.residual:
            to_blocked([np.ascontiguousarray(inputs[1])], [zb], None)
        conv.run(at.geo, xb, zb if spec.residual else None, yb, scratch)
        to_plain([yb], [outputs[0]], None)

    # the max shape and batch 1 build their matmuls and filters now, not on a request
    for shape in {max_shape, (1, *max_shape[1:])}:
        at = layout(shape)
        if at is not None:
            conv.prepare(at.geo)
    run.impl = "reorder+winograd-f4x4+onednn-matmul"  # type: ignore[attr-defined]
    return run
