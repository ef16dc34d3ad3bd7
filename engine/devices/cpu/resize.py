"""CPU kernels of Resize, PixelShuffle and PixelUnshuffle (engine/ops/resize.py): a numba separable gather over the
reference's own source taps (float32; other dtypes run the reference), and a strided copy; GridSample
(engine/ops/grid_sample.py): numpy gathers of the taps in float32."""

from __future__ import annotations

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu.kernel import Backends, CpuKernel, reference_fallback
from engine.devices.cpu.loops import resize as RK
from engine.devices.cpu.threads import parallel_for
from engine.ir import Node
from engine.ops.grid_sample import sample
from engine.ops.registry import TensorInfo
from engine.ops.resize import has_size, pixel_view, resize_reference, size_input, taps, unshuffle_view


def build_resize(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
    if np.dtype(ins[0].dtype) != np.float32:  # rare: the reference, marked so the profile lists it
        return reference_fallback(node, resize_reference)
    cache: dict[tuple, tuple] = {}

    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        key = (x.shape, out.shape)
        t = cache.get(key)
        if t is None:
            has = has_size(node, size_input(node, inputs))
            iy, wy = taps(node, 0, x.shape[2], out.shape[2], has)
            ix, wx = taps(node, 1, x.shape[3], out.shape[3], has)
            t = cache[key] = (iy.astype(np.uintp), wy, ix.astype(np.uintp), wx)
        work = out.size * t[0].shape[1] * t[2].shape[1]
        parallel_for(RK.separable, x.shape[0] * x.shape[1], work, x, out, *t)
    run.impl = "numba:separable"  # type: ignore[attr-defined]
    return run


def _copy_kernel(view):
    def build(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
        def run(inputs, outputs, workspace):
            src = view(node, inputs[0])
            np.copyto(outputs[0].reshape(src.shape), src)
        return run
    return build


def _grid_sample_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    # vectorised gathers of the four taps, in float32 for float32 data (torch's CPU kernel computes in the
    # data's type too)
    def run(inputs, outputs, workspace):
        compute = np.dtype(np.float64) if inputs[0].dtype == np.float64 else np.dtype(np.float32)
        np.copyto(outputs[0], sample(node, inputs[0], inputs[1], compute), casting="unsafe")
    return run


KERNELS = {"Resize": CpuKernel(build_resize), "GridSample": CpuKernel(_grid_sample_kernel),
           "PixelShuffle": CpuKernel(_copy_kernel(pixel_view)),
           "PixelUnshuffle": CpuKernel(_copy_kernel(unshuffle_view))}
