"""CPU kernels of the volumetric ops (engine/ops/volume.py): Conv3d and Pool3d on oneDNN, float32 NCDHW in and out.

Conv3d: one convolution primitive per input shape, src and dst plain NCDHW (the model's tensors, no reorders),
weights in the layout the primitive asks for (reordered once per layout), bias the primitive's. Pool3d: oneDNN's
max or average-excluding-padding pooling; ceil_mode becomes extra end padding, which neither counts (max never
reads padding, the average divides by the window clipped to the input), so both are exact. Each primitive gets
its own scratchpad at build. With oneDNN off, or another dtype, the numpy reference runs (a fallback the runtime
lists).
"""

from __future__ import annotations

import logging

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu.kernel import Backends, CpuKernel, ShapeCache, reference_fallback, remember
from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import objects as D
from engine.errors import KernelError
from engine.ir import Node
from engine.ops.registry import TensorInfo
from engine.ops.volume import conv3d_reference, conv_geometry, pool3d_reference, pool_geometry

log = logging.getLogger("engine.onednn")
_F32 = np.dtype(np.float32)


class _Conv3dPlan:
    def __init__(self, node: Node, shape: tuple[int, ...], weights: list):
        out, k, stride, dil, pads, g = conv_geometry(node, shape)
        w = np.ascontiguousarray(node.attrs["weight"], np.float32)
        wshape = w.shape if g == 1 else (g, w.shape[0] // g, *w.shape[1:])
        bias = node.attrs.get("bias")
        self.bias = None if bias is None else np.ascontiguousarray(np.ravel(bias), np.float32)
        src, dst = D.MemoryDesc.plain(shape), D.MemoryDesc.plain(out)
        w_any = D.MemoryDesc.any(wshape)
        b_md = None if self.bias is None else D.MemoryDesc.plain(self.bias.shape)
        attr = D.Attr()
        self.pd = D.PrimitiveDesc.create(
            "dnnl_convolution_forward_primitive_desc_create", D.engine(), L.FORWARD_INFERENCE,
            L.CONVOLUTION_DIRECT, src.h, w_any.h, None if b_md is None else b_md.h, dst.h, L.dims(stride),
            L.dims(d - 1 for d in dil), L.dims(pads[:3]), L.dims(pads[3:]), attr.h)
        w_md, pad = self.pd.md(L.QUERY_WEIGHTS_MD), self.pd.md(L.QUERY_SCRATCHPAD_MD)
        self.weights = next((buf for md, buf in weights if md == w_md), None)
        if self.weights is None:  # (the layouts met so far, shared by the plans of every input shape)
            self.weights = D.reorder_into(w, D.MemoryDesc.plain(wshape), w_md)
            weights.append((w_md, self.weights))
        self.scratch = D.aligned_buffer(pad.nbytes) if pad.nbytes else None
        args = {L.ARG_SRC: src, L.ARG_WEIGHTS: w_md, L.ARG_DST: dst, L.ARG_SCRATCHPAD: pad}
        if b_md is not None:
            args[L.ARG_BIAS] = b_md
        work = int(np.prod(out)) * w.shape[1] * int(np.prod(k))
        self.step = D.Step(D.Primitive(self.pd), args, work)

    def run(self, x: np.ndarray, out: np.ndarray) -> None:
        ptrs = {L.ARG_SRC: D.address(x), L.ARG_WEIGHTS: D.address(self.weights), L.ARG_DST: D.address(out)}
        if self.scratch is not None:
            ptrs[L.ARG_SCRATCHPAD] = D.address(self.scratch)
        if self.bias is not None:
            ptrs[L.ARG_BIAS] = D.address(self.bias)
        self.step.run(ptrs)
        D.wait()


class _Pool3dPlan:
    def __init__(self, node: Node, shape: tuple[int, ...]):
        out, k, stride, pads = pool_geometry(node, shape)
        # the end pads oneDNN needs for out = (in + pads - k) / stride + 1 exactly (ceil_mode widens them)
        ends = [max(pads[3 + a], (out[2 + a] - 1) * stride[a] + k[a] - shape[2 + a] - pads[a]) for a in range(3)]
        alg = L.POOL_MAX if node.params["mode"] == "max" else L.POOL_AVG_EXCLUDE
        src, dst = D.MemoryDesc.plain(shape), D.MemoryDesc.plain(out)
        attr = D.Attr()
        self.pd = D.PrimitiveDesc.create(
            "dnnl_pooling_forward_primitive_desc_create", D.engine(), L.FORWARD_INFERENCE, alg, src.h, dst.h,
            L.dims(stride), L.dims(k), L.dims((0, 0, 0)), L.dims(pads[:3]), L.dims(ends), attr.h)
        pad = self.pd.md(L.QUERY_SCRATCHPAD_MD)
        self.scratch = D.aligned_buffer(pad.nbytes) if pad.nbytes else None
        self.step = D.Step(D.Primitive(self.pd), {L.ARG_SRC: src, L.ARG_DST: dst, L.ARG_SCRATCHPAD: pad},
                           int(np.prod(out)) * int(np.prod(k)))

    def run(self, x: np.ndarray, out: np.ndarray) -> None:
        D.run_src_dst(self.step, x, out, self.scratch)


def _planned(node: Node, ins: list[TensorInfo], make) -> Kernel:
    """A kernel keeping one plan per input shape (the max shape's built now, smaller ones on first use)."""
    D.sync_threads()
    max_shape = tuple(ins[0].shape)
    first = make(max_shape)
    plans = ShapeCache({max_shape: first})

    def run(inputs, outputs, workspace):
        x = np.ascontiguousarray(inputs[0])
        plan = plans.get(x.shape)
        if plan is None:
            if any(a > b for a, b in zip(x.shape, max_shape, strict=True)):
                raise KernelError(f"{node.where()}: {node.op_type} input {x.shape} is beyond the max shape "
                                  f"{max_shape} it was planned for")
            plan = remember(plans, x.shape, make(x.shape))
        D.sync_threads()
        plan.run(x, outputs[0])

    log.debug("%s: oneDNN %s for input %s: %s", node.where(), node.op_type, max_shape, first.pd.impl)
    run.impl = f"onednn:{first.pd.impl}"  # type: ignore[attr-defined]
    return run


def _build_conv3d(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
    if not backends.onednn or np.dtype(ins[0].dtype) != _F32:
        return reference_fallback(node, conv3d_reference)
    weights: list = []
    return _planned(node, ins, lambda shape: _Conv3dPlan(node, shape, weights))


def _build_pool3d(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
    if not backends.onednn or np.dtype(ins[0].dtype) != _F32:
        return reference_fallback(node, pool3d_reference)
    return _planned(node, ins, lambda shape: _Pool3dPlan(node, shape))


KERNELS = {"Conv3d": CpuKernel(_build_conv3d), "Pool3d": CpuKernel(_build_pool3d)}
