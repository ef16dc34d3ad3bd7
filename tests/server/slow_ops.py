"""Test-only plugin (NNSERVE_PLUGINS=slow_ops): every Sigmoid execution takes SECONDS longer, so a test can make a
model slower than its clients (the sleep releases the GIL: the server stays responsive)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from engine.ir import Node
from engine.ops.registry import OPS, TensorInfo, all_ops

SECONDS = 0.1


def _wrap(original):  # noqa: ANN001, ANN202 - OpDef in, OpDef out
    def kernel(node: Node, ins: list[TensorInfo]):  # noqa: ANN202
        inner = original.kernel(node, ins) if original.kernel else None

        def fn(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray], workspace: np.ndarray) -> None:
            time.sleep(SECONDS)
            if inner is not None:
                inner(inputs, outputs, workspace)
            else:
                outputs[0][...] = original.reference(node, list(inputs))[0]

        return fn

    def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
        time.sleep(SECONDS)
        return original.reference(node, arrays)

    return dataclasses.replace(original, kernel=kernel, reference=reference)


OPS["Sigmoid"] = _wrap(all_ops()["Sigmoid"])
