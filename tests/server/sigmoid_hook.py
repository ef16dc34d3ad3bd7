"""What the test-only plugins (faulty_ops, held_ops, slow_ops) share: they run a check before every Sigmoid, in its
numpy reference and in its CPU kernel, registered the way a plugin registers an op (engine.ops.register and
engine.devices.cpu.register_kernel, with replace=True since Sigmoid exists). Hooks chain: a second plugin wraps
what the first registered."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from engine.devices.cpu import KERNELS, register_kernel
from engine.ir import Node
from engine.ops import get_op, register
from engine.ops.registry import TensorInfo

Hook = Callable[[Node, np.ndarray], None]  # (the Sigmoid node, its input); raises or blocks as the test wants


def hook_sigmoid(before: Hook) -> None:
    original_op, original_kernel = get_op("Sigmoid"), KERNELS["Sigmoid"]

    def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
        before(node, arrays[0])
        return original_op.reference(node, arrays)

    def build(backends, node: Node, ins: list[TensorInfo]):  # noqa: ANN001, ANN202 - CpuKernel's builder
        inner = original_kernel.build(backends, node, ins)

        def fn(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray], workspace: np.ndarray) -> None:
            before(node, inputs[0])
            inner(inputs, outputs, workspace)

        return fn

    register(dataclasses.replace(original_op, reference=reference), replace=True)
    register_kernel("Sigmoid", build, original_kernel.workspace, replace=True)
