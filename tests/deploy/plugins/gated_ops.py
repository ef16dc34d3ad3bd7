"""Test-only plugin (NNSERVE_PLUGINS=gated_ops, NNSERVE_TEST_GATE=<directory>): a Sigmoid node named `gate` does not
compute until the file `open` exists in that directory, and marks each execution that reaches it with a file
`entered-*` there. A test thereby holds a model's executions (its warm-up, so its load; its requests, so they stay
in flight) exactly as long as it chooses, and sees that they are held: no timing is involved. Every other Sigmoid
runs unchanged."""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engine.devices.cpu import KERNELS, register_kernel
from engine.ir import Node
from engine.ops import get_op, register
from engine.ops.registry import TensorInfo

GATE_DIR = Path(os.environ["NNSERVE_TEST_GATE"])
NODE_NAME = "gate"
_executions = itertools.count()


def wait_at_gate() -> None:
    (GATE_DIR / f"entered-{os.getpid()}-{next(_executions)}").touch()
    while not (GATE_DIR / "open").exists():
        time.sleep(0.01)  # polls a condition the test sets; how long it takes does not matter


def _wrap_reference(original):  # noqa: ANN001, ANN202 - OpDef in, OpDef out
    def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
        if node.name == NODE_NAME:
            wait_at_gate()
        return original.reference(node, arrays)

    return dataclasses.replace(original, reference=reference)


def _wrap_kernel(original):  # noqa: ANN001, ANN202 - CpuKernel in, builder out
    def build(backends, node: Node, ins: list[TensorInfo]):  # noqa: ANN001, ANN202
        inner = original.build(backends, node, ins)
        if node.name != NODE_NAME:
            return inner

        def fn(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray], workspace: np.ndarray) -> None:
            wait_at_gate()
            inner(inputs, outputs, workspace)

        return fn

    return build


register(_wrap_reference(get_op("Sigmoid")), replace=True)
register_kernel("Sigmoid", _wrap_kernel(KERNELS["Sigmoid"]), KERNELS["Sigmoid"].workspace, replace=True)
