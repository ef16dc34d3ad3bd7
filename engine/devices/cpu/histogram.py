"""CPU kernel of `Histogram` (engine/ops/histogram.py): numpy's bincount into the output; a bin index outside
[0, depth) is an error of the request."""

from __future__ import annotations

import numpy as np

from engine.devices.cpu.kernel import Backends, CpuKernel
from engine.errors import KernelError
from engine.ir import Node
from engine.ops.registry import TensorInfo


def _build(backends: Backends, node: Node, ins: list[TensorInfo]):
    depth = int(node.params["depth"])

    def run(inputs, outputs, workspace):
        flat = inputs[0].reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= depth):
            raise KernelError(f"{node.where()}: Histogram bin index {int(flat.min())}..{int(flat.max())} outside "
                              f"[0, {depth})")
        outputs[0][...] = np.bincount(flat, minlength=depth)
    return run


KERNELS = {"Histogram": CpuKernel(_build)}
