"""CPU kernels of the copying layout ops (engine/ops/shape.py): Transpose, Expand, Tile, Cast and Identity copy
into the output view; Meshgrid broadcasts each input into its output; Shape writes the dims. The alias ops
(Reshape and co.) need none: the runtime makes the view.
"""

from __future__ import annotations

import numpy as np

from engine.devices.cpu.kernel import Backends, CpuKernel
from engine.ir import Node
from engine.ops.registry import TensorInfo
from engine.ops.shape import float_to_int_cast, meshgrid_views, shape_slice, tile_reps, transpose_perm


def _copy_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    op = node.op_type
    perm = transpose_perm(node, len(ins[0].shape)) if op == "Transpose" else None  # the rank is fixed for an instance
    float_to_int = op == "Cast" and float_to_int_cast(ins[0].dtype, node)

    def run(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        if op == "Transpose":
            _transpose(x, perm, out)
        elif op == "Tile":
            reps = tile_reps(node, x.ndim)
            xs = (1,) * (len(reps) - x.ndim) + x.shape
            # out viewed as (r0, d0, r1, d1, ...) receives x broadcast over the repeat axes: no temporary
            np.copyto(out.reshape([v for r, d in zip(reps, xs, strict=True) for v in (r, d)]),
                      x.reshape([v for d in xs for v in (1, d)]))
        elif float_to_int:
            with np.errstate(invalid="ignore"):  # see float_to_int_cast
                np.copyto(out, x, casting="unsafe")
        else:  # Expand broadcasts x into out; Cast and Identity convert or copy
            np.copyto(out, x, casting="unsafe")
    return run


def _transpose(x: np.ndarray, perm: tuple[int, ...], out: np.ndarray) -> None:
    """out = x.transpose(perm). When the last axis stays last and holds two elements or more (MobileViT's 2x2
    patches: two floats; the blocked layout's 8 or 16 lanes), both sides are viewed as one element of that many
    bytes per row: numpy's copy costs per innermost run. One thread, AVX2 EPYC, numpy 2, (4, 64, n, k) -> (4, n,
    64, k) float32, rows as whole elements against as floats: k = 2 and 4 0.07x, k = 3, 5-7 0.37-0.53x, 8-128
    0.42-0.66x; EfficientFormerV2's blocked (8, 16, 7, 7, 8) -> (8, 7, 7, 16, 8) 63 -> 16-31 us."""
    if (x.ndim >= 2 and x.shape[-1] >= 2 and perm[-1] == x.ndim - 1 and x.size and not x.dtype.hasobject
            and x.strides[-1] == x.itemsize and out.flags.c_contiguous):
        width = x.shape[-1] * x.itemsize
        whole = np.dtype(f"V{width}")
        x, out = x.view(whole), out.view(whole)
    np.copyto(out, x.transpose(perm))


def _shape_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    def run(inputs, outputs, workspace):
        outputs[0][...] = shape_slice(node, inputs[0].shape)
    return run


def _meshgrid_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    def run(inputs, outputs, workspace):
        _, views = meshgrid_views(node, [x.shape for x in inputs])  # the run's sizes, within the instance's max
        for x, view, out in zip(inputs, views, outputs, strict=True):
            np.copyto(out, x.reshape(view))
    return run


KERNELS = {**{op: CpuKernel(_copy_kernel) for op in ("Transpose", "Expand", "Tile", "Cast", "Identity")},
           "Shape": CpuKernel(_shape_kernel), "Meshgrid": CpuKernel(_meshgrid_kernel)}
