"""Test-only plugin (NNSERVE_PLUGINS=slow_ops): every Sigmoid execution takes SECONDS longer, so a test can make a
model slower than its clients (the sleep releases the GIL: the server stays responsive)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from engine.devices.cpu import KERNELS, register_kernel
from engine.ir import Node
from engine.ops import get_op, register
from engine.ops.registry import TensorInfo

SECONDS = 0.1


def _wrap_reference(original):  # noqa: ANN001, ANN202 - OpDef in, OpDef out
    def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
        time.sleep(SECONDS)
        return original.reference(node, arrays)

    return dataclasses.replace(original, reference=reference)


def _wrap_kernel(original):  # noqa: ANN001, ANN202 - CpuKernel in, builder out
    def build(backends, node: Node, ins: list[TensorInfo]):  # noqa: ANN001, ANN202
        inner = original.build(backends, node, ins)

        def fn(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray], workspace: np.ndarray) -> None:
            time.sleep(SECONDS)
            inner(inputs, outputs, workspace)

        return fn

    return build


# as a plugin registers an op (tests/server/faulty_ops.py): its meaning and its CPU kernel, replacing Sigmoid's
register(_wrap_reference(get_op("Sigmoid")), replace=True)
register_kernel("Sigmoid", _wrap_kernel(KERNELS["Sigmoid"]), KERNELS["Sigmoid"].workspace, replace=True)
