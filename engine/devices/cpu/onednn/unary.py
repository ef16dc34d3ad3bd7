"""One-input, one-output oneDNN primitives over plain float32 arrays: eltwise (the activations: GELU erf and tanh,
SiLU, sigmoid, tanh, ELU, hard-swish, ...) and softmax / log-softmax. Their jit kernels are vectorised (exp and erf
as polynomials) and split over OpenMP's threads, where our numba loops call libm per element on one thread.

Primitives depend on the shape: each kernel keeps one plan per input shape (the max shape's built with the kernel).
Below MIN_ELEMENTS a call costs more in ctypes than the numba loop takes, so small tensors keep the loop
(`fallback`). Any scratchpad a primitive asks for is its own buffer (allocated once per plan, like a weight).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu.kernel import ShapeCache, remember
from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import objects as D

MIN_ELEMENTS = 1 << 13
WORK_PER_ELEMENT = 16  # an exp or erf polynomial: ~16 multiply-adds, for threads.threads_for
SOFTMAX_ACCURATE, SOFTMAX_LOG = 0x30000, 0x30001

Create = Callable[[D.MemoryDesc, D.MemoryDesc, D.Attr], D.PrimitiveDesc]


def eltwise_desc(alg: str, alpha: float, beta: float) -> Create:
    def create(src: D.MemoryDesc, dst: D.MemoryDesc, attr: D.Attr) -> D.PrimitiveDesc:
        return D.PrimitiveDesc.create("dnnl_eltwise_forward_primitive_desc_create", D.engine(), L.FORWARD_INFERENCE,
                                      L.ELTWISE[alg], src.h, dst.h, ctypes.c_float(alpha), ctypes.c_float(beta),
                                      attr.h)
    return create


def softmax_desc(log: bool, axis: int) -> Create:
    def create(src: D.MemoryDesc, dst: D.MemoryDesc, attr: D.Attr) -> D.PrimitiveDesc:
        return D.PrimitiveDesc.create("dnnl_softmax_forward_primitive_desc_create", D.engine(), L.FORWARD_INFERENCE,
                                      SOFTMAX_LOG if log else SOFTMAX_ACCURATE, src.h, dst.h, axis, attr.h)
    return create


class Plan:
    def __init__(self, create: Create, shape: tuple[int, ...]):
        md = D.MemoryDesc.plain(shape)
        self.work = WORK_PER_ELEMENT * math.prod(shape)  # a small one is created, and runs, on one thread
        with D.creating(self.work):
            self.pd = create(md, md, D.Attr())
            pad = self.pd.md(L.QUERY_SCRATCHPAD_MD)
            self.scratch = D.aligned_buffer(pad.nbytes) if pad.nbytes else None
            self.step = D.Step(D.Primitive(self.pd), {L.ARG_SRC: md, L.ARG_DST: md, L.ARG_SCRATCHPAD: pad})
        if self.scratch is not None:
            self.step.mems[L.ARG_SCRATCHPAD].set(self.scratch.ctypes.data)
        self._bound: tuple[int, int] | None = None

    def run(self, x: np.ndarray, out: np.ndarray) -> None:
        key = (D.address(x), D.address(out))
        D.sync_threads(self.work)
        if key != self._bound:
            self.step.mems[L.ARG_SRC].set(key[0])
            self.step.mems[L.ARG_DST].set(key[1])
            self._bound = key
        try:
            L.check(L.LIB.dnnl_primitive_execute(self.step.prim.h, D.stream(), len(self.step.args),
                                                 self.step.args), "dnnl_primitive_execute")
            D.wait()
        finally:
            D.restore_threads()


def build(create: Create, view: Callable[[tuple[int, ...]], tuple[int, ...]], fallback: Kernel, label: str,
          max_shape: tuple[int, ...]) -> Kernel:
    """A kernel running `create`'s primitive on float32 C-contiguous inputs of MIN_ELEMENTS or more, viewed as
    `view(shape)` (the plan's dims), and `fallback` on the rest."""
    plans: dict[tuple[int, ...], Plan] = ShapeCache()
    if int(np.prod(max_shape)) >= MIN_ELEMENTS:
        D.sync_threads()
        plans[view(max_shape)] = Plan(create, view(max_shape))

    def run(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        if x.size < MIN_ELEMENTS or not x.flags.c_contiguous:
            fallback(inputs, outputs, workspace)
            return
        dims = view(x.shape)
        plan = plans.get(dims)
        if plan is None:
            plan = remember(plans, dims, Plan(create, dims))
        plan.run(x, out)

    run.impl = f"onednn:{label}"  # type: ignore[attr-defined]
    return run
