"""Test-only plugin (NNSERVE_PLUGINS=faulty_ops): the Sigmoid kernel raises when its input holds a value beyond
POISON, so a test can make exactly the executions it chooses fail inside the engine."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from engine.ir import Node
from engine.ops.registry import OPS, TensorInfo, all_ops

POISON = 1e30


def _check(x: np.ndarray) -> None:
    if np.any(np.abs(x) > POISON):
        raise RuntimeError("injected fault")


def _wrap(original):  # noqa: ANN001, ANN202 - OpDef in, OpDef out
    def kernel(node: Node, ins: list[TensorInfo]):  # noqa: ANN202
        inner = original.kernel(node, ins) if original.kernel else None

        def fn(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray], workspace: np.ndarray) -> None:
            _check(inputs[0])
            if inner is not None:
                inner(inputs, outputs, workspace)
            else:
                outputs[0][...] = original.reference(node, list(inputs))[0]

        return fn

    def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
        _check(arrays[0])
        return original.reference(node, arrays)

    return dataclasses.replace(original, kernel=kernel, reference=reference)


OPS["Sigmoid"] = _wrap(all_ops()["Sigmoid"])
