"""CPU kernel of `RoiAlign` (engine/ops/roi_align.py): a numba loop over the ROIs, float32 as TNN's acc computes
it (ROIs split across the thread pool). Per ROI the sample points' corner offsets and weights are computed once and
shared by every channel. A batch index outside the input is an error of the request. Other dtypes run the numpy
reference."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from engine.devices.cpu.kernel import Backends, CpuKernel, reference_fallback
from engine.devices.cpu.threads import parallel_for
from engine.errors import KernelError
from engine.ir import Node
from engine.ops.registry import TensorInfo
from engine.ops.roi_align import reference

_F32 = np.dtype(np.float32)


@njit(nogil=True, cache=True)
def _corner(v, size):
    if v <= 0:
        v = np.float32(0)
    low = int(v)
    if low >= size - 1:
        return size - 1, size - 1, np.float32(0)
    return low, low + 1, np.float32(v - low)


@njit(nogil=True, cache=True)
def _rois(x, rois, idx, out, use_max, scale, ratio, lo, hi):
    h, w = x.shape[2], x.shape[3]
    c_n, oh, ow = out.shape[1], out.shape[2], out.shape[3]
    one = np.float32(1)
    for r in range(lo, hi):
        b = idx[r]
        x1, y1 = rois[r, 0] * scale, rois[r, 1] * scale
        rw, rh = max(rois[r, 2] * scale - x1, one), max(rois[r, 3] * scale - y1, one)
        bh, bw = rh / np.float32(oh), rw / np.float32(ow)
        gh = ratio if ratio > 0 else int(math.ceil(rh / oh))
        gw = ratio if ratio > 0 else int(math.ceil(rw / ow))
        n = oh * ow * gh * gw
        pos = np.zeros((n, 4), np.int64)
        wts = np.zeros((n, 4), np.float32)
        k = 0
        for ph in range(oh):
            for pw in range(ow):
                for iy in range(gh):
                    yy = y1 + ph * bh + np.float32(iy + 0.5) * bh / np.float32(gh)
                    for ix in range(gw):
                        xx = x1 + pw * bw + np.float32(ix + 0.5) * bw / np.float32(gw)
                        if not (yy < -1 or yy > h or xx < -1 or xx > w):
                            y0, y_1, ly = _corner(yy, h)
                            x0, x_1, lx = _corner(xx, w)
                            hy, hx = one - ly, one - lx
                            pos[k, 0], pos[k, 1] = y0 * w + x0, y0 * w + x_1
                            pos[k, 2], pos[k, 3] = y_1 * w + x0, y_1 * w + x_1
                            wts[k, 0], wts[k, 1], wts[k, 2], wts[k, 3] = hy * hx, hy * lx, ly * hx, ly * lx
                        k += 1
        count = np.float32(gh * gw)
        for c in range(c_n):
            img = x[b, c].ravel()
            k = 0
            for ph in range(oh):
                for pw in range(ow):
                    acc = np.float32(0)
                    for s in range(gh * gw):
                        t0 = wts[k, 0] * img[pos[k, 0]]
                        t1 = wts[k, 1] * img[pos[k, 1]]
                        t2 = wts[k, 2] * img[pos[k, 2]]
                        t3 = wts[k, 3] * img[pos[k, 3]]
                        if use_max:
                            v = max(max(max(t0, t1), t2), t3)
                            acc = v if s == 0 else max(acc, v)
                        else:
                            acc += t0 + t1 + t2 + t3
                        k += 1
                    out[r, c, ph, pw] = acc if use_max else acc / count


def _build(backends: Backends, node: Node, ins: list[TensorInfo]):
    if np.dtype(ins[0].dtype) != _F32:
        return reference_fallback(node, reference)
    use_max = node.params["mode"] == "max"
    scale, ratio = np.float32(node.params["spatial_scale"]), int(node.params.get("sampling_ratio", 0))
    c, hw = ins[0].shape[1], ins[0].shape[2] * ins[0].shape[3]

    def run(inputs, outputs, workspace):
        x, rois = np.ascontiguousarray(inputs[0]), np.ascontiguousarray(inputs[1], np.float32)
        idx = np.ascontiguousarray(inputs[2], np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= x.shape[0]):
            raise KernelError(f"{node.where()}: RoiAlign batch index {int(idx.min())}..{int(idx.max())} outside the "
                              f"input's batch of {x.shape[0]}")
        out = outputs[0]
        parallel_for(_rois, out.shape[0], out.size * 4 + out.shape[0] * hw // max(c, 1), x, rois, idx, out, use_max,
                     scale, ratio)
    return run


KERNELS = {"RoiAlign": CpuKernel(_build)}
