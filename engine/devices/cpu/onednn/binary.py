"""BroadcastBlocked's Add / Sub / Mul on oneDNN's binary primitive: a blocked value (N, Cb, H, W, B) with a
per-channel operand (N, Cb, 1, 1, B) broadcast over H and W, both in nChw{B}c (the squeeze-excite scale;
8x144x56x56: 0.66 -> 0.42 ms against the numba loop). The small operand must be the second one (x - s, not
s - x); primitives are cached per input shape.
"""

from __future__ import annotations

from engine.devices.base import Kernel
from engine.devices.cpu.fused_calls import step_native
from engine.devices.cpu.kernel import ShapeCache, remember
from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.onednn.blocked import blocked_md

ALGORITHMS = {"Add": 0x1FFF0, "Mul": 0x1FFF1, "Sub": 0x1FFF5}  # dnnl_binary_add / _mul / _sub
ARG_SRC_1 = 2  # DNNL_ARG_SRC_1 (DNNL_ARG_SRC_0 is ARG_SRC)


def supported(op: str, small_first: bool) -> bool:
    """Whether the binary primitive computes this op with the small operand on that side; the caller checks oneDNN
    is on."""
    return op in ALGORITHMS and (not small_first or op != "Sub")


class _Plan:
    def __init__(self, op: str, shape: tuple[int, ...]):
        n, cb, h, w, b = shape
        full, small = blocked_md((n, cb * b, h, w), b), blocked_md((n, cb * b, 1, 1), b)
        attr = D.Attr()
        self.pd = D.PrimitiveDesc.create("dnnl_binary_primitive_desc_create", D.engine(), ALGORITHMS[op], full.h,
                                         small.h, full.h, attr.h)
        self.step = D.Step(D.Primitive(self.pd), {L.ARG_SRC: full, ARG_SRC_1: small, L.ARG_DST: full},
                           n * cb * h * w * b)  # it splits by OpenMP's count when it runs


def build(op: str, small_first: bool, fallback: Kernel) -> Kernel:
    """inputs (x, s) or (s, x) as `small_first` says; shapes the fallback checks are checked there first."""
    plans: dict[tuple, _Plan] = ShapeCache()

    def run(inputs, outputs, workspace):
        x, s = (inputs[1], inputs[0]) if small_first else (inputs[0], inputs[1])
        if x.ndim != 5 or s.shape != x.shape[:2] + (1, 1) + x.shape[4:] or not (
                x.flags.c_contiguous and s.flags.c_contiguous):
            fallback(inputs, outputs, workspace)
            return
        plan = plans.get(x.shape)
        if plan is None:
            plan = remember(plans, x.shape, _Plan(op, x.shape))
        D.sync_threads()
        plan.step.run({L.ARG_SRC: D.address(x), ARG_SRC_1: D.address(s), L.ARG_DST: D.address(outputs[0])})
        D.wait()

    def native(inputs, outputs, workspace):
        x, s = (inputs[1], inputs[0]) if small_first else (inputs[0], inputs[1])
        plan = plans.get(x.shape)
        if plan is None or x.ndim != 5 or s.shape != x.shape[:2] + (1, 1) + x.shape[4:] or not (
                x.flags.c_contiguous and s.flags.c_contiguous):
            return None
        ptrs = {L.ARG_SRC: D.address(x), ARG_SRC_1: D.address(s), L.ARG_DST: D.address(outputs[0])}
        return step_native(plan.step, ptrs, plan)

    run.native = native  # type: ignore[attr-defined]
    run.impl = "onednn:binary"  # type: ignore[attr-defined]
    return run
