"""Test-only plugin (NNSERVE_PLUGINS=held_ops, NNSERVE_TEST_GATE=<directory>): the Sigmoid kernel holds an execution
whose input has a value beyond HOLD until the file `open` exists in that directory, marking each held execution with
a file `entered-*` there; an input beyond SLOW (and within HOLD) makes the execution sleep SLOW_SECONDS. A test
thereby chooses which requests stay executing, for as long as it wants, and sees that they do; the others run
unchanged. With the affine fixture, a row of four 1e26 (held) or four 1e13 (slow) drives the Sigmoid input past
those bounds. Tests never import this module: importing it replaces the Sigmoid op in the importing process."""

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

HOLD, SLOW = 1e20, 1e9
SLOW_SECONDS = 0.03
GATE_DIR = Path(os.environ["NNSERVE_TEST_GATE"])  # required: the gate is the test's own directory
_executions = itertools.count()


def _pause(x: np.ndarray) -> None:
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    if peak > HOLD:
        (GATE_DIR / f"entered-{os.getpid()}-{next(_executions)}").touch()
        while not (GATE_DIR / "open").exists():
            time.sleep(0.01)  # polls a condition the test sets; how long it takes does not matter
    elif peak > SLOW:
        time.sleep(SLOW_SECONDS)


def _wrap_reference(original):  # noqa: ANN001, ANN202 - OpDef in, OpDef out
    def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
        _pause(arrays[0])
        return original.reference(node, arrays)

    return dataclasses.replace(original, reference=reference)


def _wrap_kernel(original):  # noqa: ANN001, ANN202 - CpuKernel in, builder out
    def build(backends, node: Node, ins: list[TensorInfo]):  # noqa: ANN001, ANN202
        inner = original.build(backends, node, ins)

        def fn(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray], workspace: np.ndarray) -> None:
            _pause(inputs[0])
            inner(inputs, outputs, workspace)

        return fn

    return build


# as a plugin registers an op (tests/server/faulty_ops.py): its meaning and its CPU kernel, replacing Sigmoid's
register(_wrap_reference(get_op("Sigmoid")), replace=True)
register_kernel("Sigmoid", _wrap_kernel(KERNELS["Sigmoid"]), KERNELS["Sigmoid"].workspace, replace=True)
