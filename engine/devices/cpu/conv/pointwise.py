"""Plain (NCHW) 1x1 convolutions (stride 1, no padding, one group) on oneDNN's matmul primitive: per image,
y (O, HW) = act(W (O, C) @ x (C, HW) + bias + z), the bias and the residual binary-add post-ops, the activation
eltwise post-ops where a conv would fuse them (onednn/eltwise.conv_post_op; else our pass after).

Why: on NCHW these are one GEMM of the weights by the image, which our direct path ran on numpy's sgemm split
in column blocks over Python callbacks, the bias and activation a pass after. One-layer graphs, 2 vCPUs, Intel
Xeon (AVX-512), wall ms, that path / this one's matmul alone / ORT: 32->64 @56 0.245 / 0.050 / 0.070, 320->1280
@7 0.339 / 0.157 / 0.125, 96->24 @56 0.226 / 0.054 / 0.106.

How: oneDNN's optimized matmul kernels (brg) take neither a bias along M nor W broadcast over a batch of x (both
ref:any), so the bias is a binary add of a (1, O, 1) operand (its per-channel broadcast of a 3-D dst) and the
images run one after another on one primitive of shape (1, O, C) @ (1, C, HW), its memories re-pointed per
image (Step.run, and as OP_SET records in a native program). A conv for which oneDNN has only its reference
matmul stays on the direct path (`applies`).
"""

from __future__ import annotations

import logging
import weakref

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu.epilogue import activation_records, apply_activation
from engine.devices.cpu.fused_calls import Native
from engine.devices.cpu.kernel import ShapeCache, remember
from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.onednn.eltwise import conv_post_op
from engine.devices.cpu.threads import threads_for
from engine.errors import KernelError
from engine.ir import Node
from engine.ops.conv_geometry import conv_geom, weight_of
from engine.ops.registry import TensorInfo

log = logging.getLogger("engine.onednn")

_F32 = 4


class Spec:
    """What does not depend on the input's batch or map: W (O, C), bias, residual, post-ops."""

    def __init__(self, node: Node, residual: bool):
        self.node, self.residual = node, residual
        w = weight_of(node)
        self.o, self.c = int(w.shape[0]), int(w.shape[1])
        self.w = np.ascontiguousarray(w.reshape(self.o, self.c), np.float32)
        bias = node.attrs.get("bias")
        self.bias = None if bias is None else np.ascontiguousarray(np.ravel(bias), np.float32)
        self.act = node.params.get("activation"), node.params.get("activation_params")
        self.elt = conv_post_op(*self.act)
        self.late = self.elt is None and self.act[0] is not None  # applied after the primitive

    def plan(self, hw: int) -> Plan:
        return Plan(self, hw)


class Plan:
    """The primitive for one map size (HW pixels), with its argument memories (a D.Step)."""

    def __init__(self, spec: Spec, hw: int):
        o, c = spec.o, spec.c
        src, wts, dst = D.MemoryDesc.plain((1, o, c)), D.MemoryDesc.plain((1, c, hw)), D.MemoryDesc.plain((1, o, hw))
        args = {L.ARG_SRC: src, L.ARG_WEIGHTS: wts, L.ARG_DST: dst}
        post: list[tuple] = []
        if spec.bias is not None:
            args[L.ARG_POST_OP_SRC1(len(post))] = bias_md = D.MemoryDesc.plain((1, o, 1))
            post.append(("binary_add", bias_md))
        self.z_arg = L.ARG_POST_OP_SRC1(len(post)) if spec.residual else None
        if spec.residual:
            args[self.z_arg] = dst
            post.append(("binary_add", dst))
        post.extend(spec.elt or ())
        work, attr = o * c * hw, D.Attr(post)  # held until the primitive is made: its handle is freed with it
        with D.creating(work):
            pd = D.PrimitiveDesc.create("dnnl_matmul_primitive_desc_create", D.engine(), src.h, wts.h, None, dst.h,
                                        attr.h)
            pad = pd.md(L.QUERY_SCRATCHPAD_MD)
            args[L.ARG_SCRATCHPAD] = pad
            self.step = D.Step(D.Primitive(pd), args, work)
        self.impl, self.pad_bytes = pd.impl, D.aligned(pad.nbytes)
        self.hw, self.private = hw, None

    def pointers(self, spec: Spec, x: int, z: int | None, out: int, n: int, workspace) -> list[dict[int, int]]:
        """Each image's {argument: address} for x, z, out (contiguous (n, C|O, HW) float32 at these addresses)."""
        fixed = {L.ARG_SRC: spec.w.ctypes.data, L.ARG_SCRATCHPAD: D.scratch_address(self, workspace)}
        if spec.bias is not None:
            fixed[L.ARG_POST_OP_SRC1(0)] = spec.bias.ctypes.data
        x_step, out_step = spec.c * self.hw * _F32, spec.o * self.hw * _F32
        images = []
        for i in range(n):
            ptrs = dict(fixed)
            ptrs[L.ARG_WEIGHTS], ptrs[L.ARG_DST] = x + i * x_step, out + i * out_step
            if self.z_arg is not None:
                ptrs[self.z_arg] = z + i * out_step
            images.append(ptrs)
        return images


def applies(node: Node, ins: list[TensorInfo]) -> bool:
    """Whether this float32 conv (oneDNN on, supported: the caller checked) is a plain 1x1 one that oneDNN's
    optimized matmul computes at the max shape."""
    geo = conv_geom(node, ins[0].shape)
    if not (geo.groups == 1 and geo.kh == geo.kw == 1 and geo.stride == (1, 1) and not any(geo.pads)):
        return False
    if min(geo.o, geo.c, geo.h * geo.w) <= 0:
        return False
    return not _probe(node, len(ins) > 1, geo.h * geo.w)[1].impl.startswith("ref")


def workspace(node: Node, ins: list[TensorInfo]) -> int:
    geo = conv_geom(node, ins[0].shape)
    return _probe(node, len(ins) > 1, geo.h * geo.w)[1].pad_bytes + D.ALIGN


# node -> (residual, pixels, spec, its plan at the max shape): what `applies` and `workspace` asked about a conv,
# handed to the next `build` of it (which owns it from then on: a plan's memories are re-pointed per run, so no
# two kernels share one), so that a load creates its primitive once rather than three times
_PROBES: weakref.WeakKeyDictionary[Node, tuple[bool, int, Spec, Plan]] = weakref.WeakKeyDictionary()


def _probe(node: Node, residual: bool, hw: int) -> tuple[Spec, Plan]:
    hit = _PROBES.get(node)
    if hit is None or hit[:2] != (residual, hw):
        spec = Spec(node, residual)
        hit = _PROBES[node] = (residual, hw, spec, spec.plan(hw))
    return hit[2], hit[3]


def build(node: Node, ins: list[TensorInfo]) -> Kernel:
    max_shape = tuple(ins[0].shape)
    D.sync_threads()
    residual, hw = len(ins) > 1, max_shape[2] * max_shape[3]
    hit = _PROBES.pop(node, None)
    if hit is not None and hit[:2] == (residual, hw):
        spec, first = hit[2], hit[3]
    else:
        spec = Spec(node, residual)
        first = spec.plan(hw)
    plans = ShapeCache({first.hw: first})

    def plan_for(x: np.ndarray) -> Plan:
        if any(a > b for a, b in zip(x.shape, max_shape, strict=True)):
            raise KernelError(f"{node.where()}: Conv input {x.shape} is beyond the max shape {max_shape} its "
                              "workspace was planned for")
        hw = x.shape[2] * x.shape[3]
        plan = plans.get(hw)
        if plan is None:
            plan = remember(plans, hw, spec.plan(hw))
            log.debug("%s: oneDNN matmul for a 1x1 conv over %d pixels: %s", node.where(), hw, plan.impl)
        return plan

    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        z = np.ascontiguousarray(inputs[1]) if spec.residual else None
        if x.shape[0] == 0 or x.shape[2] * x.shape[3] == 0:
            return
        D.sync_threads()
        plan = plan_for(x)
        z_ptr = None if z is None else D.address(z)
        for ptrs in plan.pointers(spec, D.address(x), z_ptr, D.address(out), x.shape[0], workspace):
            plan.step.run(ptrs)
        D.wait()
        if spec.late:
            apply_activation(spec.act[0], spec.act[1], out)

    def native(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        z = inputs[1] if spec.residual else None
        if not x.flags.c_contiguous or not out.flags.c_contiguous or (z is not None and not z.flags.c_contiguous):
            return None
        if x.shape[0] == 0 or x.shape[2] * x.shape[3] == 0:
            return Native([])
        plan = plans.get(x.shape[2] * x.shape[3])
        act = activation_records(*spec.act, out) if spec.late else ([], [])
        if plan is None or act is None:
            return None
        default = threads_for(None)
        records = []
        for ptrs in plan.pointers(spec, D.address(x), None if z is None else D.address(z), D.address(out),
                                  x.shape[0], workspace):
            records += plan.step.records(ptrs, default)
        return Native(records + [D.wait_record()] + act[0], [], [plan, spec, *act[1]])

    log.debug("%s: oneDNN matmul for a 1x1 conv over %d pixels: %s", node.where(), first.hw, first.impl)
    run.native = native  # type: ignore[attr-defined]
    run.impl = f"onednn-matmul:{first.impl}"  # type: ignore[attr-defined]
    return run
