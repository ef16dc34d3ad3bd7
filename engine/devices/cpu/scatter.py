"""CPU kernels of the writes into a copy (engine/ops/scatter.py) and of Full (engine/ops/generate.py).

SliceAssign, IndexPut and ScatterElements copy input 0 into the output unless the planner gave the output input
0's own buffer (their in-place case: nothing reads input 0 afterwards), then write the region. A source that
shares memory with the output (a view of the same tensor) is copied first, so the write never reads what it has
overwritten.
Numpy does the strided writes; these ops are memory-bound copies, so that is the kernel, not a fallback.
"""

from __future__ import annotations

import numpy as np

from engine.devices.cpu.kernel import Backends, CpuKernel
from engine.ir import Node
from engine.ir.dtypes import to_dtype
from engine.ops.registry import TensorInfo
from engine.ops.scatter import index_put_into, region_index, scatter_elements_into
from engine.ops.tensor import slice_bounds


def _into(out: np.ndarray, x: np.ndarray) -> None:
    """out = x, skipped when they are the same buffer (the planner's in-place case)."""
    if out.ctypes.data != x.ctypes.data or out.shape != x.shape:
        np.copyto(out, x)


def _source(src: np.ndarray, out: np.ndarray) -> np.ndarray:
    return src.copy() if np.may_share_memory(src, out) else src


def _slice_assign_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    def run(inputs, outputs, workspace):
        x, src, out = inputs[0], inputs[1], outputs[0]
        index = region_index(node, x.shape, slice_bounds(node, inputs[2:]))
        src = _source(src, out)
        _into(out, x)
        region = out[index]
        np.copyto(region, np.broadcast_to(src, region.shape), casting="unsafe")  # torch's copy_ casts
    return run


def _index_put_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    def run(inputs, outputs, workspace):
        out = outputs[0]
        values, indices = _source(inputs[1], out), [_source(i, out) for i in inputs[2:]]
        _into(out, inputs[0])
        index_put_into(node, out, values, indices)
    return run


def _scatter_elements_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    def run(inputs, outputs, workspace):
        out = outputs[0]
        idx, updates = _source(inputs[1], out), _source(inputs[2], out)
        _into(out, inputs[0])
        scatter_elements_into(node, out, idx, updates)
    return run


def _full_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    value = np.array(node.params["value"]).astype(to_dtype(node.params["dtype"]))

    def run(inputs, outputs, workspace):
        outputs[0].fill(value)
    return run


KERNELS = {"SliceAssign": CpuKernel(_slice_assign_kernel), "IndexPut": CpuKernel(_index_put_kernel),
           "ScatterElements": CpuKernel(_scatter_elements_kernel), "Full": CpuKernel(_full_kernel)}
