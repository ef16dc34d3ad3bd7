"""CPU kernel of Attention (engine/ops/attention.py): two matmuls around a numba softmax, the (…, L, S) scores kept
in the workspace."""

from __future__ import annotations

import math

import numpy as np

from engine.devices.cpu.kernel import Backends, CpuKernel, empty, numba_ok, reference_fallback
from engine.devices.cpu.loops.normalize import softmax_loop
from engine.ir import Node
from engine.ops import attention
from engine.ops.attention import causal_block, masked_fill, scale, shapes
from engine.ops.registry import TensorInfo
from engine.ops.rules import float_of


def _workspace(backends: Backends, node: Node, ins: list[TensorInfo]) -> int:
    scores, _ = shapes(node, ins)
    return math.prod(scores) * float_of(ins[0].dtype).itemsize


def build(backends: Backends, node: Node, ins: list[TensorInfo]):
    dt = float_of(ins[0].dtype)
    if not numba_ok(dt):
        return reference_fallback(node, attention.reference)
    scores_max, _ = shapes(node, ins)
    blocked = causal_block(*scores_max[-2:]) if node.params.get("is_causal") else None
    softmax_loop(empty(3, dt), empty(3, dt), False, True)

    def run(inputs, outputs, workspace):
        q, k, v = inputs[:3]
        mask = inputs[3] if len(inputs) > 3 else None
        batch = q.shape[:-2] if q.shape[:-2] == k.shape[:-2] else np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        shape = (*batch, q.shape[-2], k.shape[-2])
        scores = _scratch(workspace, shape, dt)
        np.matmul(q, np.swapaxes(k, -1, -2), out=scores, casting="unsafe")
        scores *= dt.type(scale(node, q.shape[-1]))
        masked_fill(scores, mask, blocked)
        view = (-1, shape[-1], 1)
        softmax_loop(scores.reshape(view), scores.reshape(view), False, True)
        np.matmul(scores, v, out=outputs[0], casting="unsafe")
    return run


def _scratch(workspace: np.ndarray | None, shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    n = math.prod(shape)
    if workspace is not None and workspace.nbytes >= n * dt.itemsize:
        return workspace.reshape(-1).view(np.uint8)[:n * dt.itemsize].view(dt).reshape(shape)
    return np.empty(shape, dt)  # called without the planned workspace (direct use outside the runtime)


KERNELS = {"Attention": CpuKernel(build, _workspace)}
