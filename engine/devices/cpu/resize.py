"""CPU kernels of Resize, PixelShuffle and PixelUnshuffle (engine/ops/resize.py): a numba separable gather over the
reference's own source taps (float32; other dtypes run the reference), or, where those taps repeat every input a
whole number of times (nearest upsampling by whole factors), row copies, or, where they are bilinear upsampling by 2,
the same sums as vector passes over every row at once (small maps); and a strided copy; GridSample
(engine/ops/grid_sample.py): numpy gathers of the taps in float32.

Where OpenMP's threads spin through a request (threads.native_regions) the row copies and the bilinear passes split
as one native region (loops/resize.resize_team) from NATIVE_RESIZE_OUTPUTS up: split from Python, the second thread
starts tens of microseconds late (EfficientFormerV2's 1024 planes 7x7 -> 14x14: 0.18 ms on one thread, 0.22 split
from Python; the model in-process 0.965-0.974x at batch 1, 0.992x at batch 8).
"""

from __future__ import annotations

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu.kernel import Backends, CpuKernel, reference_fallback, remember
from engine.devices.cpu.loops import resize as RK
from engine.devices.cpu.threads import get_threads, native_regions, parallel_for, region_job, run_native
from engine.ir import Node
from engine.ops.grid_sample import sample
from engine.ops.registry import TensorInfo
from engine.ops.resize import has_size, pixel_view, resize_reference, size_input, taps, unshuffle_view

# Outputs from which a resize splits as a native region (a few microseconds a region, ~0.5 ns an output).
NATIVE_RESIZE_OUTPUTS = 1 << 15


def _native(kind: int, x: np.ndarray, out: np.ndarray, ky: int = 2, kx: int = 2) -> bool:
    """x (items, h, w) -> out as one native region (loops/resize.resize_team) where it pays and applies; False,
    nothing run, otherwise (the caller splits from Python)."""
    if out.size < NATIVE_RESIZE_OUTPUTS or get_threads() < 2 or not native_regions():
        return False
    if not (x.dtype == out.dtype == np.float32 and x.flags.c_contiguous and out.flags.c_contiguous
            and x.ndim == out.ndim == 3 and out.shape == (x.shape[0], x.shape[1] * ky, x.shape[2] * kx)):
        return False
    job = region_job(RK.RESIZE_LEN)
    job[RK.RESIZE_KIND:RK.RESIZE_X] = kind, *x.shape, ky, kx
    job[RK.RESIZE_X], job[RK.RESIZE_OUT] = x.ctypes.data, out.ctypes.data
    return run_native(RK.resize_team().address, job)


def _is_bilinear_2x(idx: np.ndarray, w: np.ndarray, n_in: int) -> bool:
    """Whether one axis's taps are those of RK.bilinear_2x: 2 n_in outputs, output 2j from inputs j - 1 and j
    weighted 0.25 and 0.75, 2j + 1 from j and j + 1 weighted 0.75 and 0.25, the edges clamped as torch's
    half-pixel bilinear upsampling by 2 clamps them (the first output input 0 alone, the last input n - 1 twice)."""
    if idx.shape != (2 * n_in, 2):
        return False
    j = np.arange(n_in)
    want_idx = np.empty((2 * n_in, 2), np.int64)
    want_idx[0::2] = np.stack([j - 1, j], axis=1)
    want_idx[1::2] = np.stack([j, np.minimum(j + 1, n_in - 1)], axis=1)
    want_idx[0] = (0, min(1, n_in - 1))
    want_w = np.empty((2 * n_in, 2), np.float32)
    want_w[0::2], want_w[1::2], want_w[0] = (0.25, 0.75), (0.75, 0.25), (1.0, 0.0)
    return np.array_equal(idx, want_idx) and np.array_equal(w, want_w)


def _repeat_factor(idx: np.ndarray, w: np.ndarray, n_in: int) -> int:
    """k when one axis's taps repeat every input k times in order (output i reads input i // k, weight 1: nearest
    upsampling by a whole factor), else 0."""
    k = idx.shape[0] // max(n_in, 1)
    if idx.shape != (k * n_in, 1) or k < 1 or not np.all(w == 1):
        return 0
    return k if np.array_equal(idx[:, 0], np.arange(k * n_in) // k) else 0


def build_resize(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
    if np.dtype(ins[0].dtype) != np.float32:  # rare: the reference, marked so the profile lists it
        return reference_fallback(node, resize_reference)
    cache: dict[tuple, tuple] = {}
    RK.resize_team()  # compiled (or loaded) with the kernel, not on its first request

    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        key = (x.shape, out.shape)
        t = cache.get(key)
        if t is None:
            has = has_size(node, size_input(node, inputs))
            iy, wy = taps(node, 0, x.shape[2], out.shape[2], has)
            ix, wx = taps(node, 1, x.shape[3], out.shape[3], has)
            repeat = _repeat_factor(iy, wy, x.shape[2]), _repeat_factor(ix, wx, x.shape[3])
            t = remember(cache, key, (iy.astype(np.uintp), wy, ix.astype(np.uintp), wx,
                                      _is_bilinear_2x(iy, wy, x.shape[2]) and _is_bilinear_2x(ix, wx, x.shape[3]),
                                      repeat if all(repeat) else None))
        work = out.size * t[0].shape[1] * t[2].shape[1]
        planes = x.shape[0] * x.shape[1]
        if t[5] is not None and out.flags.c_contiguous:
            # copies, a quarter of a gathered tap an output: split from 1M outputs on (one thread / split over two:
            # 256 planes 20 -> 40 0.107 / 0.113 ms, 128 40 -> 80 0.14 / 0.16, 64 160 -> 320 1.6-1.9 / 0.9), by input
            # rows: split by planes, an image's 3 planes of 320 -> 640 went 2 to one thread, 1 to the other (0.21 ms on
            # one thread, 0.27 split; by rows 0.21)
            rows, ky = planes * x.shape[2], t[5][0]
            xs, outs = x.reshape(rows, 1, x.shape[3]), out.reshape(rows, ky, out.shape[3])
            if not _native(RK.RESIZE_NEAREST, xs, outs, *t[5]):
                parallel_for(RK.nearest_repeat, rows, out.size // 4, xs, outs, *t[5])
            return
        if t[4] and out.flags.c_contiguous:
            # vector passes: an output costs about one gathered tap, so its work is the output's size (1024 planes
            # of 7x7 -> 14x14 in EfficientFormerV2 ran in 0.20 ms on one thread, 0.29 ms split over two)
            xs, outs = x.reshape(planes, *x.shape[2:]), out.reshape(planes, *out.shape[2:])
            if not _native(RK.RESIZE_BILINEAR_2X, xs, outs):
                parallel_for(RK.bilinear_2x, planes, out.size, xs, outs)
            return
        parallel_for(RK.separable, planes, work, x, out, *t[:4])
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
