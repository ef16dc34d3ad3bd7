"""Test-only plugin (NNSERVE_PLUGINS=faulty_ops): the Sigmoid kernel raises when its input holds a value beyond
POISON, so a test can make exactly the executions it chooses fail inside the engine.

It wraps the op the way a plugin registers one: its meaning with engine.ops.register and its CPU kernel with
engine.devices.cpu.register_kernel (both with replace=True, since Sigmoid exists already).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from engine.devices.cpu import KERNELS, register_kernel
from engine.ir import Node
from engine.ops import get_op, register
from engine.ops.registry import TensorInfo

POISON = 1e30


def _check(x: np.ndarray) -> None:
    if np.any(np.abs(x) > POISON):
        raise RuntimeError("injected fault")


def _wrap_reference(original):  # noqa: ANN001, ANN202 - OpDef in, OpDef out
    def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
        _check(arrays[0])
        return original.reference(node, arrays)

    return dataclasses.replace(original, reference=reference)


def _wrap_kernel(original):  # noqa: ANN001, ANN202 - CpuKernel in, builder out
    def build(backends, node: Node, ins: list[TensorInfo]):  # noqa: ANN001, ANN202
        inner = original.build(backends, node, ins)

        def fn(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray], workspace: np.ndarray) -> None:
            _check(inputs[0])
            inner(inputs, outputs, workspace)

        return fn

    return build


register(_wrap_reference(get_op("Sigmoid")), replace=True)
register_kernel("Sigmoid", _wrap_kernel(KERNELS["Sigmoid"]), KERNELS["Sigmoid"].workspace, replace=True)
