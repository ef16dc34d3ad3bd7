"""Test-only ops with hand-written kernels, registered for a test and removed after it.

They let runtime tests exercise kernels, in-place reuse, aliases, fallbacks and host values without
depending on the real op families.
"""

from __future__ import annotations

import contextlib

import numpy as np

from engine.devices.cpu import KERNELS, register_kernel
from engine.ops.registry import OPS, OpDef, TensorInfo, register


def _same(node, ins):
    return [TensorInfo(ins[0].shape, ins[0].dtype)]


def _double_kernel(backends, node, ins):
    def run(inputs, outputs, ws):
        np.multiply(inputs[0], 2, out=outputs[0])
    return run


def _tile4_infer(node, ins):
    *lead, k = ins[0].shape
    return [TensorInfo((*lead, 4 * k), ins[0].dtype)]


def _tile4_kernel(backends, node, ins):
    def run(inputs, outputs, ws):
        k = inputs[0].shape[-1]
        for i in range(4):
            outputs[0][..., i * k:(i + 1) * k] = inputs[0]
    return run


def _split_last_infer(node, ins):
    *lead, k = ins[0].shape
    parts = node.params["parts"]
    return [TensorInfo((*lead, parts, k // parts), ins[0].dtype)]


def _sum_last_infer(node, ins):
    return [TensorInfo(ins[0].shape[:-1], ins[0].dtype)]


def _sum_last_kernel(backends, node, ins):
    def run(inputs, outputs, ws):
        np.sum(inputs[0], axis=-1, out=outputs[0])
    return run


def _add_infer(node, ins):
    return [TensorInfo(np.broadcast_shapes(ins[0].shape, ins[1].shape), ins[0].dtype)]


def _add_kernel(backends, node, ins):
    def run(inputs, outputs, ws):
        np.add(inputs[0], inputs[1], out=outputs[0])
    return run


def _shape_infer(node, ins):
    return [TensorInfo((len(ins[0].shape),), np.dtype(np.int64), np.array(ins[0].shape, dtype=np.int64))]


def _boom_kernel(backends, node, ins):
    def run(inputs, outputs, ws):
        raise ValueError("operands could not be broadcast together")
    return run


def _scratch_kernel(backends, node, ins):
    def run(inputs, outputs, ws):
        assert ws.nbytes >= 1000
        np.copyto(outputs[0], inputs[0])
    return run


def _shrinking_infer(node, ins):
    """Not monotone: the output grows as the input shrinks (what the bind-time check must catch)."""
    return [TensorInfo((64 // ins[0].shape[0],), ins[0].dtype)]


def _add_inplace_kernel(backends, node, ins):
    def run(inputs, outputs, ws):
        np.add(inputs[0], inputs[1], out=outputs[0])
    return run


# What T_Probe's kernel saw of its input 0, one entry per call: (address, array), for the binding tests.
PROBED: list[tuple[int, np.ndarray]] = []


def _probe_kernel(backends, node, ins):
    def run(inputs, outputs, ws):
        PROBED.append((inputs[0].ctypes.data, inputs[0]))
        np.copyto(outputs[0], inputs[0])
    return run


def _view_kernel(backends, node, ins):
    raise AssertionError("alias ops must never be run")


# (meaning, CPU kernel builder or None, workspace or None)
TOY_OPS = [
    (OpDef("T_AddInplace", _add_infer, lambda n, a: [a[0] + a[1]], inplace=True), _add_inplace_kernel, None),
    (OpDef("T_View", _same, lambda n, a: [a[0].copy()], alias=True), _view_kernel, None),
    (OpDef("T_Shrinking", _shrinking_infer, lambda n, a: [np.zeros(64 // a[0].shape[0], a[0].dtype)]), None, None),
    (OpDef("T_Double", _same, lambda n, a: [a[0] * 2], inplace=True), _double_kernel, None),
    (OpDef("T_Neg", _same, lambda n, a: [-a[0]], inplace=True), None, None),  # no kernel: reference fallback
    (OpDef("T_Tile4", _tile4_infer, lambda n, a: [np.concatenate([a[0]] * 4, axis=-1)]), _tile4_kernel, None),
    (OpDef("T_SplitLast", _split_last_infer,
           lambda n, a: [a[0].reshape(*a[0].shape[:-1], n.params["parts"], -1)], alias=True), None, None),
    (OpDef("T_SumLast", _sum_last_infer, lambda n, a: [a[0].sum(-1)]), _sum_last_kernel, None),
    (OpDef("T_Add", _add_infer, lambda n, a: [a[0] + a[1]]), _add_kernel, None),
    (OpDef("T_Shape", _shape_infer, lambda n, a: [np.array(a[0].shape, dtype=np.int64)]), None, None),
    (OpDef("T_Boom", _same, lambda n, a: [a[0]]), _boom_kernel, None),
    (OpDef("T_Scratch", _same, lambda n, a: [a[0].copy()]), _scratch_kernel, lambda b, n, i: 1000),
    (OpDef("T_Probe", _same, lambda n, a: [a[0].copy()]), _probe_kernel, None),
]


@contextlib.contextmanager
def toy_ops():
    """The toy ops registered the way a plugin registers its ops, and removed afterwards."""
    for op, build, workspace in TOY_OPS:
        register(op)
        if build is not None:
            register_kernel(op.op_type, build, workspace)
    try:
        yield
    finally:
        PROBED.clear()
        for op, _, _ in TOY_OPS:
            OPS.pop(op.op_type, None)
            KERNELS.pop(op.op_type, None)
