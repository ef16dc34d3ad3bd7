"""The CPU device: numpy arena, the op's own kernel when it has one, else its numpy reference."""

from __future__ import annotations

import numpy as np

from engine.devices.base import Device
from engine.errors import KernelError
from engine.ir import Node
from engine.memory.arena import Arena
from engine.ops.registry import Kernel, OpDef, TensorInfo


class CpuDevice(Device):
    name = "cpu"

    def allocate(self, nbytes: int) -> Arena:
        return Arena(nbytes)

    def build_kernel(self, node: Node, op: OpDef, ins: list[TensorInfo]) -> Kernel:
        if op.kernel is not None:
            return op.kernel(node, ins)
        return reference_kernel(node, op)


def reference_kernel(node: Node, op: OpDef) -> Kernel:
    """Runs the numpy reference and copies its results into the preallocated outputs (allocates; a fallback)."""
    reference = op.reference

    def run_reference(inputs, outputs, workspace) -> None:
        results = reference(node, list(inputs))
        for out, res in zip(outputs, results, strict=True):
            if np.shape(res) != out.shape:
                raise KernelError(f"{node.where()}: {node.op_type} node {node.name!r} produced shape "
                                  f"{np.shape(res)} where {out.shape} was inferred")
            np.copyto(out, res, casting="unsafe")

    run_reference.is_fallback = True  # type: ignore[attr-defined]
    return run_reference
