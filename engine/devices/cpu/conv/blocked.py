"""CPU kernel of ConvBlocked (engine/devices/cpu/layout/conv_blocked.py): Winograd F(4x4)/F(2x2) where it pays
(winograd_blocked.py), else oneDNN's convolution through the one plan of onednn.py, its blocked sides in
nChw{B}c; a depthwise or grouped conv oneDNN has only its gemm-based kernel for, the direct numba one on plain
copies of its blocked sides (`_PlainDirect`), or, depthwise of stride 1 between blocked sides, a numba loop on the
blocked values themselves (depthwise_blocked.py). Plans are cached per input shape: the kernel is built at the max
shape and also runs smaller batches; the workspace holds the larger of the plan's buffers and the Winograd chunk's.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu.conv import direct
from engine.devices.cpu.conv import winograd_blocked as W
from engine.devices.cpu.conv.depthwise_blocked import BlockedDepthwise
from engine.devices.cpu.conv.onednn import (
    BoundRuns,
    ConvSpec,
    Plan,
    is_jit,
    plan_native,
    prefers_own_layouts,
    primitive_impl,
)
from engine.devices.cpu.epilogue import apply_activation
from engine.devices.cpu.fused_calls import Native
from engine.devices.cpu.kernel import Backends, ShapeCache, reference_fallback, remember
from engine.devices.cpu.layout import conv_blocked
from engine.devices.cpu.layout.conv_blocked import geometry
from engine.devices.cpu.layout.kernels import reorder
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.threads import get_threads
from engine.errors import KernelError
from engine.ir import Node
from engine.ops.conv_geometry import ConvGeom
from engine.ops.registry import TensorInfo

log = logging.getLogger("engine.onednn")


def _spec(node: Node, residual: bool, max_shape: tuple[int, ...]) -> ConvSpec:
    """The oneDNN plan's spec of a ConvBlocked node: its geometry on physical shapes, its blocked sides, and whether
    its max shape prefers oneDNN's own layouts (every shape then asks for them first)."""
    return ConvSpec(node, residual, geometry, int(node.params["block"]), bool(node.params.get("src_blocked")),
                    bool(node.params.get("dst_blocked")), prefers_own_layouts(geometry(node, max_shape)))


class _Winograds:
    """The Winograd paths of one conv (one per output tile size a shape picked, W.choose), or none when the conv
    is not eligible."""

    def __init__(self, spec: ConvSpec, geo: ConvGeom, enabled: bool):
        self.spec = spec
        self.eligible = enabled and W.eligible(geo, spec.block, spec.src_blocked, spec.dst_blocked)
        self._convs: dict[int, W.WinogradConv] = {}

    def pick(self, geo: ConvGeom) -> tuple[W.WinogradConv, int] | None:
        """(the conv for this shape's tile size, its workspace bytes), or None for the direct kernel."""
        m = W.choose(geo, self.spec.block, get_threads()) if self.eligible else None
        if m is None:
            return None
        conv = self._convs.get(m)
        if conv is None:
            conv = self._convs[m] = W.WinogradConv(self.spec.w, self.spec.bias, *self.spec.act, m=m,
                                                      block=self.spec.block)
        return conv, conv.workspace_bytes(geo)


class _PlainDirect:
    """A depthwise or grouped ConvBlocked that oneDNN has only its gemm-based kernel for (direct.OVER_ONEDNN_GEMM):
    its blocked input (and residual) copied to NCHW in the workspace, the direct numba kernel into an NCHW buffer
    there, copied back to the blocked output. The copies cost a fraction of the conv they replace (3x3 d12 256 @65
    between two blocked layers: 11.4-12.3 ms on oneDNN's gemm kernel)."""

    def __init__(self, backends: Backends, spec: ConvSpec, max_shape: tuple[int, ...]):
        self.spec = spec
        geo, f32 = geometry(spec.node, max_shape), np.dtype(np.float32)
        infos = [TensorInfo((geo.n, geo.c, geo.h, geo.w), f32)]
        if spec.residual:
            infos.append(TensorInfo(geo.out_shape, f32))
        self.kernel = direct.build_conv(backends.blas, spec.node, infos)
        self.to_plain, self.to_blocked = (reorder(backends.onednn, b, spec.block, f32) for b in (False, True))
        self.private: list[np.ndarray] = []
        self.layouts: dict[tuple, tuple] = {}  # per input shape: what `_layout` returns

    @staticmethod
    def applies(spec: ConvSpec, shape: tuple[int, ...]) -> bool:
        geo = geometry(spec.node, shape)
        return direct.kind(geo) in direct.OVER_ONEDNN_GEMM and not is_jit(primitive_impl(spec, shape))

    @staticmethod
    def parts(spec: ConvSpec, geo: ConvGeom) -> list[int]:
        """Bytes of the NCHW input, output and residual copies (0 for a side already NCHW)."""
        x, y = geo.n * geo.c * geo.h * geo.w * 4, math.prod(geo.out_shape) * 4
        return [x if spec.src_blocked else 0, y if spec.dst_blocked else 0,
                y if spec.dst_blocked and spec.residual else 0]

    @classmethod
    def nbytes(cls, spec: ConvSpec, geo: ConvGeom) -> int:
        return sum(D.aligned(p) for p in cls.parts(spec, geo))

    def _layout(self, shape: tuple[int, ...]) -> tuple[list, int]:
        """([(byte offset, shape) of the NCHW input, output and residual copies, (None, None) for a side already
        NCHW], their bytes in all)."""
        geo = geometry(self.spec.node, shape)
        at, places = 0, []
        for nbytes, plain in zip(self.parts(self.spec, geo), [(geo.n, geo.c, geo.h, geo.w), geo.out_shape,
                                                              geo.out_shape], strict=True):
            places.append((at, plain) if nbytes else (None, None))
            at += D.aligned(nbytes)
        return places, at

    def _calls(self, x: np.ndarray, z: np.ndarray | None, out: np.ndarray,
               workspace: np.ndarray | None) -> list[tuple]:
        """(kernel, inputs, outputs) in the order `run` calls them: the plain copies, the direct conv, the copy
        back (the plain sides in the workspace, at the same addresses run after run)."""
        layout = self.layouts.get(x.shape) or remember(self.layouts, x.shape, self._layout(x.shape))
        buf = aligned_workspace(workspace, layout[1], self.private)
        xp, yp, zp = (None if at is None else buf[at:at + 4 * math.prod(shape)].view(np.float32).reshape(shape)
                      for at, shape in layout[0])
        calls = []
        if xp is not None:
            calls.append((self.to_plain, [x], [xp]))
        if zp is not None:
            calls.append((self.to_plain, [z], [zp]))
        ins = [x if xp is None else xp] + ([] if z is None else [z if zp is None else zp])
        calls.append((self.kernel, ins, [out if yp is None else yp]))
        if yp is not None:
            calls.append((self.to_blocked, [yp], [out]))
        return calls

    def run(self, x: np.ndarray, z: np.ndarray | None, out: np.ndarray, workspace: np.ndarray | None) -> None:
        for kernel, ins, outs in self._calls(x, z, out, workspace):
            kernel(ins, outs, None)

    def records(self, x: np.ndarray, z: np.ndarray | None, out: np.ndarray,
                workspace: np.ndarray | None) -> Native | None:
        """`run` on these (contiguous) arrays as native_program records: each call's own, None where any call
        has none (it would run Python)."""
        merged = Native([], [], [])
        for kernel, ins, outs in self._calls(x, z, out, workspace):
            got = kernel.native(ins, outs, None) if hasattr(kernel, "native") else None
            if got is None:
                return None
            merged.records += got.records
            merged.checks += got.checks
            merged.keep += [*got.keep, *ins, *outs]
        return merged


def _blocked_depthwise(spec: ConvSpec, shape: tuple[int, ...]) -> bool:
    """Whether a conv `_PlainDirect` applies to runs on the blocked values themselves (depthwise_blocked.py):
    a depthwise one of stride 1 with both sides blocked."""
    geo = geometry(spec.node, shape)
    return spec.src_blocked and spec.dst_blocked and direct.kind(geo) == "depthwise" and BlockedDepthwise.applies(geo)


def workspace(backends: Backends, node: Node, ins: list[TensorInfo]) -> int:
    """Bytes for the max shape's reordered plain sides and scratchpad (or its Winograd buffers, whichever is
    larger), plus room to align the start."""
    if np.dtype(ins[0].dtype) != np.float32 or not backends.onednn:
        return 0
    D.sync_threads()
    shape = tuple(ins[0].shape)
    spec = _spec(node, len(ins) > 1, shape)
    geo = geometry(node, shape)
    if _PlainDirect.applies(spec, shape):
        return 0 if _blocked_depthwise(spec, shape) else _PlainDirect.nbytes(spec, geo) + D.ALIGN
    wino = _Winograds(spec, geo, backends.winograd).pick(geo)
    return max(Plan(spec, shape).nbytes, 0 if wino is None else wino[1]) + D.ALIGN


def aligned_workspace(workspace: np.ndarray | None, nbytes: int, private: list) -> np.ndarray:
    """An ALIGN-aligned uint8 view of at least `nbytes` of the workspace (or of a private buffer)."""
    ptr, size = D.workspace_base(workspace)
    if size >= nbytes:
        off = ptr - D.address(workspace)
        return workspace[off:off + size]
    if not private or private[0].nbytes < nbytes:  # a shape whose buffers outgrow the max shape's (not seen within it)
        private[:] = [D.aligned_buffer(nbytes)]
    return private[0]


def _blocked_depthwise_kernel(node: Node, spec: ConvSpec) -> Kernel:
    """ConvBlocked's kernel when `_blocked_depthwise` holds: the loop of depthwise_blocked.py, no workspace."""
    conv = BlockedDepthwise(spec.w, spec.bias, *spec.act, spec.block, lambda shape: geometry(node, shape))

    def run(inputs, outputs, workspace):
        z = np.ascontiguousarray(inputs[1]) if spec.residual else None
        conv.run(np.ascontiguousarray(inputs[0]), z, outputs[0])

    def native(inputs, outputs, workspace):
        if not all(a.flags.c_contiguous for a in [*inputs, *outputs]):
            return None
        return conv.records(inputs[0], inputs[1] if spec.residual else None, outputs[0])

    run.native = native  # type: ignore[attr-defined]
    run.impl = conv.impl  # type: ignore[attr-defined]
    return run


def build(backends: Backends, node: Node, ins: list[TensorInfo]) -> Kernel:
    geometry(node, ins[0].shape)  # checks the node
    if np.dtype(ins[0].dtype) != np.float32 or not backends.onednn:
        return reference_fallback(node, conv_blocked.reference)
    max_shape = tuple(ins[0].shape)
    spec = _spec(node, len(ins) > 1, max_shape)
    D.sync_threads()
    off_jit = _PlainDirect.applies(spec, max_shape)  # creates a primitive descriptor: asked once
    if off_jit and _blocked_depthwise(spec, max_shape):
        return _blocked_depthwise_kernel(node, spec)
    if off_jit:
        plain = _PlainDirect(backends, spec, max_shape)

        def run_plain(inputs, outputs, workspace):
            x = np.ascontiguousarray(inputs[0])
            plain.run(x, np.ascontiguousarray(inputs[1]) if spec.residual else None, outputs[0], workspace)

        def native_plain(inputs, outputs, workspace):
            if not all(a.flags.c_contiguous for a in [*inputs, *outputs]):
                return None
            return plain.records(inputs[0], inputs[1] if spec.residual else None, outputs[0], workspace)

        run_plain.native = native_plain  # type: ignore[attr-defined]
        run_plain.impl = f"plain+{plain.kernel.impl}"  # type: ignore[attr-defined]
        return run_plain
    first = Plan(spec, max_shape)
    plans = ShapeCache({max_shape: first})
    winograds = _Winograds(spec, geometry(node, max_shape), backends.winograd)
    wino_plans: dict[tuple, tuple | None] = {}  # per input shape: (conv, geometry, workspace bytes) or None
    private: list[np.ndarray] = []
    bound = BoundRuns()

    def wino_plan(shape: tuple) -> tuple | None:
        if shape not in wino_plans:
            geo = geometry(node, shape)
            picked = winograds.pick(geo)
            return remember(wino_plans, shape, None if picked is None else (picked[0], geo, picked[1]))
        return wino_plans[shape]

    def run(inputs, outputs, workspace):
        if bound.hit(inputs, outputs[0], workspace):
            return
        bound.last = None  # a full run may point the plan's memories elsewhere
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        z = np.ascontiguousarray(inputs[1]) if spec.residual else None
        D.sync_threads()
        winograd = wino_plan(x.shape)
        if winograd is not None:
            conv, geo, nbytes = winograd
            try:
                conv.run(geo, x, z, out, aligned_workspace(workspace, nbytes, private))
            except KernelError as e:  # a oneDNN call inside the region failed: name the node
                raise KernelError(f"{node.where()}: {e}") from e
            return
        plan = plans.get(x.shape)
        if plan is None:
            plan = remember(plans, x.shape, Plan(spec, x.shape))
            log.debug("%s: oneDNN blocked conv for input %s: %s", node.where(), x.shape, plan.impl)
        plan.run(x, z, out, workspace)
        if spec.late:
            apply_activation(spec.act[0], spec.act[1], out)
        elif x is inputs[0]:
            bound.remember(plan, inputs, out, workspace)

    def native(inputs, outputs, workspace):
        x = inputs[0]
        winograd = wino_plan(x.shape)
        if winograd is not None:
            z = inputs[1] if spec.residual else None
            conv, geo, nbytes = winograd
            return conv.records(geo, x, z, outputs[0], aligned_workspace(workspace, nbytes, private))
        return plan_native(spec, plans.get(x.shape), inputs, outputs, workspace)

    def native_rebound(inputs, outputs, workspace, reads, writes):
        """`native` for a conv of the caller's input (a model's first) or into a fresh output: that array's
        address rebound before each replay (plan_native); a Winograd conv's region gets none."""
        if wino_plan(inputs[0].shape) is not None:
            return None
        nat = plan_native(spec, plans.get(inputs[0].shape), inputs, outputs, workspace, reads, writes)
        if nat is not None:
            bound.last = None  # its programs run instead of its Python: the caller's last array is not kept
        return nat

    run.native = native  # type: ignore[attr-defined]
    run.native_rebound = native_rebound  # type: ignore[attr-defined]
    # the max shape and batch 1 (the usual smaller request) build their matmuls and filters now, not on a request
    for shape in {max_shape, (1, *max_shape[1:])}:
        plan = wino_plan(shape)
        if plan is not None:
            plan[0].prepare(plan[1])
    at_max = wino_plan(max_shape)
    run.impl = f"winograd-f{at_max[0].m}x{at_max[0].m}+onednn-matmul" if at_max is not None else f"onednn:{first.impl}"
    run.plans = plans  # type: ignore[attr-defined]
    return run
