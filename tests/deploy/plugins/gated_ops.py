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

from engine.ir import Node
from engine.ops.registry import OPS, TensorInfo, all_ops

GATE_DIR = Path(os.environ["NNSERVE_TEST_GATE"])
NODE_NAME = "gate"
_executions = itertools.count()


def wait_at_gate() -> None:
    (GATE_DIR / f"entered-{os.getpid()}-{next(_executions)}").touch()
    while not (GATE_DIR / "open").exists():
        time.sleep(0.01)  # polls a condition the test sets; how long it takes does not matter


def _wrap(original):  # noqa: ANN001, ANN202 - OpDef in, OpDef out
    def kernel(node: Node, ins: list[TensorInfo]):  # noqa: ANN202
        inner = original.kernel(node, ins) if original.kernel else None
        if node.name != NODE_NAME:
            return inner

        def fn(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray], workspace: np.ndarray) -> None:
            wait_at_gate()
            if inner is not None:
                inner(inputs, outputs, workspace)
            else:
                outputs[0][...] = original.reference(node, list(inputs))[0]

        return fn

    def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
        if node.name == NODE_NAME:
            wait_at_gate()
        return original.reference(node, arrays)

    return dataclasses.replace(original, kernel=kernel, reference=reference)


OPS["Sigmoid"] = _wrap(all_ops()["Sigmoid"])
