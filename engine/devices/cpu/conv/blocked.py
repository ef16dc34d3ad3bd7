"""CPU kernel of ConvBlocked (engine/devices/cpu/layout/conv_blocked.py): Winograd F(4x4)/F(2x2) where it pays
(winograd_blocked.py), else a oneDNN convolution whose blocked sides use nChw{B}c descriptors directly.

A plain side is left to the primitive (`format_tag_any`) and reordered through the instance workspace when the
primitive picks another layout (as _conv_onednn does for every side). Weights are reordered once into the
layout each primitive asks for; bias is the primitive's; the epilogue `act(conv + bias + z)` is a `sum` post-op
(z copied or reordered into dst first) then an eltwise post-op, or our apply_activation on the physical output
when oneDNN lacks the function (elementwise, so layout-agnostic). Primitives are cached per input shape: the
kernel is built at the max shape and also runs smaller batches. Workspace: src | dst | scratchpad, each aligned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu.conv import winograd_blocked as W
from engine.devices.cpu.conv.onednn import eltwise
from engine.devices.cpu.epilogue import apply_activation
from engine.devices.cpu.kernel import Backends, reference_fallback
from engine.devices.cpu.layout import conv_blocked
from engine.devices.cpu.layout.conv_blocked import geometry
from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.onednn.blocked import blocked_md
from engine.ir import Node
from engine.ops.conv_geometry import ConvGeom, weight_of
from engine.ops.registry import TensorInfo

log = logging.getLogger("engine.onednn")
Geometry = Callable[[Node, tuple], ConvGeom]


class _Fixed:
    """What does not depend on the input shape: layouts, weights (in every layout asked for), post-ops."""

    def __init__(self, node: Node, geometry: Geometry, residual: bool):
        self.node, self.geometry, self.residual = node, geometry, residual
        self.block = int(node.params["block"])
        self.src_blocked = bool(node.params.get("src_blocked"))
        self.dst_blocked = bool(node.params.get("dst_blocked"))
        self.w = np.ascontiguousarray(weight_of(node), np.float32)
        bias = node.attrs.get("bias")
        self.bias = None if bias is None else np.ascontiguousarray(np.ravel(bias), np.float32)
        self.act = node.params.get("activation"), node.params.get("activation_params")
        self.elt = eltwise(*self.act)
        self.late = self.elt is None and self.act[0] is not None
        self.post_ops = ([("sum",)] if residual else []) + ([self.elt] if self.elt else [])
        self._weights: list[tuple[object, np.ndarray]] = []

    def wshape(self, geo: ConvGeom) -> tuple[int, ...]:
        g = geo.groups
        return (geo.o, geo.c, geo.kh, geo.kw) if g == 1 else (g, geo.o // g, geo.c // g, geo.kh, geo.kw)

    def weights_in(self, md, geo: ConvGeom) -> np.ndarray:
        for have, buf in self._weights:
            if have == md:
                return buf
        buf = D.reorder_into(self.w, D.MemoryDesc.plain(self.wshape(geo)), md)
        self._weights.append((md, buf))
        return buf

    def side(self, shape: tuple[int, ...], blocked: bool):
        return blocked_md(shape, self.block) if blocked else D.MemoryDesc.any(shape)


class _Plan:
    """The primitives for one physical input shape and where their buffers sit in the workspace."""

    def __init__(self, fixed: _Fixed, shape: tuple[int, ...]):
        geo = fixed.geometry(fixed.node, shape)
        x_log, y_log = (geo.n, geo.c, geo.h, geo.w), geo.out_shape
        # Locals keep the descriptors alive through the call (a temporary's handle would be freed first).
        x_req, y_req = fixed.side(x_log, fixed.src_blocked), fixed.side(y_log, fixed.dst_blocked)
        w_any = D.MemoryDesc.any(fixed.wshape(geo))
        b_md = D.MemoryDesc.plain((geo.o,)) if fixed.bias is not None else None
        attr = D.Attr(fixed.post_ops)
        self.pd = D.PrimitiveDesc.create(
            "dnnl_convolution_forward_primitive_desc_create", D.engine(), L.FORWARD_INFERENCE,
            L.CONVOLUTION_DIRECT, x_req.h, w_any.h, None if b_md is None else b_md.h, y_req.h, L.dims(geo.stride),
            L.dims(d - 1 for d in geo.dilation), L.dims(geo.pads[:2]), L.dims(geo.pads[2:]), attr.h)
        src, wts, dst, pad = (self.pd.md(q) for q in (L.QUERY_SRC_MD, L.QUERY_WEIGHTS_MD, L.QUERY_DST_MD,
                                                       L.QUERY_SCRATCHPAD_MD))
        self.weights, self.bias = fixed.weights_in(wts, geo), fixed.bias
        args = {L.ARG_SRC: src, L.ARG_WEIGHTS: wts, L.ARG_DST: dst, L.ARG_SCRATCHPAD: pad}
        if b_md is not None:
            args[L.ARG_BIAS] = b_md
        self.conv = D.Step(D.Primitive(self.pd), args)
        x_plain, y_plain = D.MemoryDesc.plain(x_log), D.MemoryDesc.plain(y_log)
        self.src_in = None if fixed.src_blocked or src == x_plain else D.reorder_step(x_plain, src)
        self.dst_out = None if fixed.dst_blocked or dst == y_plain else D.reorder_step(dst, y_plain)
        self.z_in = D.reorder_step(y_plain, dst) if self.dst_out is not None and fixed.residual else None
        self.src_bytes = D.aligned(src.nbytes) if self.src_in is not None else 0
        self.dst_bytes = D.aligned(dst.nbytes) if self.dst_out is not None else 0
        self.pad_bytes = D.aligned(pad.nbytes)
        self.private: np.ndarray | None = None  # only when the instance workspace is too small for this shape
        self._bound: tuple[int, int, int] | None = None  # (src, dst, scratchpad) pointers the memories hold

    @property
    def nbytes(self) -> int:
        return self.src_bytes + self.dst_bytes + self.pad_bytes

    @property
    def impl(self) -> str:
        return self.pd.impl

    def base(self, workspace: np.ndarray | None) -> int:
        ptr, size = D.workspace_base(workspace)
        if size >= self.nbytes:
            return ptr
        if self.private is None:  # a smaller shape whose layouts need more room than the max shape's
            self.private = D.aligned_buffer(self.nbytes)
        return self.private.ctypes.data

    def run(self, x: np.ndarray, z: np.ndarray | None, out: np.ndarray, workspace: np.ndarray | None) -> None:
        base = self.base(workspace)
        src = D.address(x)
        if self.src_in is not None:
            self.src_in.run({L.ARG_SRC: src, L.ARG_DST: base})
            src = base
        dst = base + self.src_bytes if self.dst_out is not None else D.address(out)
        if z is not None:
            if self.z_in is not None:
                self.z_in.run({L.ARG_SRC: D.address(z), L.ARG_DST: dst})
            else:
                np.copyto(out, z)
        scratch = base + self.src_bytes + self.dst_bytes
        if (src, dst, scratch) == self._bound:
            # The same arena views as last time (the usual case: bound once per input shape): only execute.
            L.check(L.LIB.dnnl_primitive_execute(self.conv.prim.h, D.stream(), len(self.conv.args),
                                                 self.conv.args), "dnnl_primitive_execute")
        else:
            ptrs = {L.ARG_SRC: src, L.ARG_WEIGHTS: self.weights.ctypes.data, L.ARG_DST: dst,
                    L.ARG_SCRATCHPAD: scratch}
            if self.bias is not None:
                ptrs[L.ARG_BIAS] = self.bias.ctypes.data
            self.conv.run(ptrs)
            self._bound = (src, dst, scratch)
        if self.dst_out is not None:
            self.dst_out.run({L.ARG_SRC: dst, L.ARG_DST: D.address(out)})
        D.wait()


class _Winograds:
    """The Winograd paths of one conv (one per output tile size a shape picked, W.choose), or none when the conv
    is not eligible."""

    def __init__(self, fixed: _Fixed, geo: ConvGeom, enabled: bool):
        self.fixed = fixed
        self.eligible = enabled and W.eligible(geo, fixed.block, fixed.src_blocked, fixed.dst_blocked)
        self._convs: dict[int, W.WinogradConv] = {}

    def pick(self, geo: ConvGeom) -> tuple[W.WinogradConv, int] | None:
        """(the conv for this shape's tile size, its workspace bytes), or None for the direct kernel."""
        m = W.choose(geo, self.fixed.block) if self.eligible else None
        if m is None:
            return None
        conv = self._convs.get(m)
        if conv is None:
            conv = self._convs[m] = W.WinogradConv(self.fixed.w, self.fixed.bias, *self.fixed.act, m=m)
        return conv, conv.workspace_bytes(geo)


def workspace(backends: Backends, node: Node, ins: list[TensorInfo]) -> int:
    """Bytes for the max shape's reordered plain sides and scratchpad (or its Winograd buffers, whichever is
    larger), plus room to align the start."""
    if np.dtype(ins[0].dtype) != np.float32 or not backends.onednn:
        return 0
    D.sync_threads()
    fixed = _Fixed(node, geometry, len(ins) > 1)
    shape = tuple(ins[0].shape)
    geo = geometry(node, shape)
    wino = _Winograds(fixed, geo, backends.winograd).pick(geo)
    return max(_Plan(fixed, shape).nbytes, 0 if wino is None else wino[1]) + D.ALIGN


def _aligned_workspace(workspace: np.ndarray | None, nbytes: int, private: list) -> np.ndarray:
    """An ALIGN-aligned uint8 view of at least `nbytes` of the workspace (or of a private buffer)."""
    ptr, size = D.workspace_base(workspace)
    if size >= nbytes:
        off = ptr - D.address(workspace)
        return workspace[off:off + size]
    if not private or private[0].nbytes < nbytes:  # a smaller shape whose chunks need more room (never seen)
        private[:] = [D.aligned_buffer(nbytes)]
    return private[0]


def build(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
    geometry(node, ins[0].shape)  # checks the node
    if np.dtype(ins[0].dtype) != np.float32 or not backends.onednn:
        return reference_fallback(node, conv_blocked.reference)
    fixed = _Fixed(node, geometry, len(ins) > 1)
    D.sync_threads()
    max_shape = tuple(ins[0].shape)
    first = _Plan(fixed, max_shape)
    plans = {max_shape: first}
    winograds = _Winograds(fixed, geometry(node, max_shape), backends.winograd)
    wino_plans: dict[tuple, tuple | None] = {}  # per input shape: (conv, geometry, workspace bytes) or None
    private: list[np.ndarray] = []

    def wino_plan(shape: tuple) -> tuple | None:
        if shape not in wino_plans:
            geo = geometry(node, shape)
            picked = winograds.pick(geo)
            wino_plans[shape] = None if picked is None else (picked[0], geo, picked[1])
        return wino_plans[shape]

    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        z = np.ascontiguousarray(inputs[1]) if fixed.residual else None
        D.sync_threads()
        winograd = wino_plan(x.shape)
        if winograd is not None:
            conv, geo, nbytes = winograd
            conv.run(geo, x, z, out, _aligned_workspace(workspace, nbytes, private))
            return
        plan = plans.get(x.shape)
        if plan is None:
            plan = plans[x.shape] = _Plan(fixed, x.shape)
            log.debug("%s: oneDNN blocked conv for input %s: %s", node.where(), x.shape, plan.impl)
        plan.run(x, z, out, workspace)
        if fixed.late:
            apply_activation(fixed.act[0], fixed.act[1], out)

    # the max shape and batch 1 (the usual smaller request) build their matmuls and filters now, not on a request
    for shape in {max_shape, (1, *max_shape[1:])}:
        plan = wino_plan(shape)
        if plan is not None:
            plan[0].prepare(plan[1])
    at_max = wino_plan(max_shape)
    run.impl = f"winograd-f{at_max[0].m}x{at_max[0].m}+onednn-matmul" if at_max is not None else f"onednn:{first.impl}"
    return run
