"""MatMulAffine: a MatMul of two activations whose output is then scaled by a scalar constant and/or offset by a
constant tensor, as one node: `(q @ kᵀ) * scale + bias`, the attention scores of EfficientFormer and LeViT
(attention biases) when the rest of their attention is not fusable (talking heads between the scores and the
softmax).

`fuse_matmul_affine` (the CPU device's `prepare`) rewrites MatMul -> Mul(scalar constant) [-> Add(constant)] and
MatMul -> Add(constant) when each intermediate is read once by the next node and is not a graph output, the
constants are float32 like the product, and the Add's constant broadcasts into the product without growing it.
The kernel is MatMul's, then the scale and the offset on its output in place, in the graph's order (the same
float32 operations: numerics unchanged); what a separate Mul and Add node cost on their own (a dispatch each,
and at small sizes that is most of their time) is gone. Anything else stays as it is.
"""

from __future__ import annotations

import logging

import numpy as np

from engine.devices.cpu import linear
from engine.devices.cpu.kernel import Backends, CpuKernel
from engine.errors import ShapeError
from engine.ir import Graph, Node, Value
from engine.ops import OPS as SHARED
from engine.ops.registry import OpDef, TensorInfo
from engine.passes.graph_edit import rewrite_on_copy, single_consumer

log = logging.getLogger("engine.passes")


# -- the op ---------------------------------------------------------------------------------------------------
def _infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    want = 2 + bool(node.params.get("has_bias"))
    if len(ins) != want:
        raise ShapeError(f"{node.where()}: MatMulAffine node {node.name!r} takes {want} inputs, got {len(ins)}")
    return SHARED["MatMul"].infer(node, ins[:2])


def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    out = SHARED["MatMul"].reference(node, arrays[:2])[0]
    return [_affine(node, out, arrays[2] if len(arrays) > 2 else None)]


def _affine(node: Node, out: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    scale = node.params.get("scale")
    if scale is not None:
        np.multiply(out, out.dtype.type(scale), out=out)
    if bias is not None:
        np.add(out, bias, out=out)
    return out


OPS = {"MatMulAffine": OpDef("MatMulAffine", _infer, reference)}


# -- the kernel -----------------------------------------------------------------------------------------------
def build(backends: Backends, node: Node, ins: list[TensorInfo]):
    inner = linear.build_matmul(backends, node, ins[:2])
    has_bias = bool(node.params.get("has_bias"))
    bias = np.ascontiguousarray(ins[2].value) if has_bias and ins[2].value is not None else None

    def run(inputs, outputs, workspace):
        inner(inputs[:2], outputs, workspace)
        _affine(node, outputs[0], bias if bias is not None else inputs[2] if has_bias else None)

    run.impl = getattr(inner, "impl", "matmul")  # type: ignore[attr-defined]
    return run


def _workspace(backends: Backends, node: Node, ins: list[TensorInfo]) -> int:
    return linear.matmul_workspace(backends, node, ins[:2])


KERNELS = {"MatMulAffine": CpuKernel(build, _workspace)}


# -- the rewrite ----------------------------------------------------------------------------------------------
def fuse_matmul_affine(graph: Graph) -> Graph:
    """A copy with every matched MatMul -> Mul -> Add chain one MatMulAffine node, or `graph` itself when none
    matches (the graph is the Model's: never edited)."""
    new, count = rewrite_on_copy(graph, "MatMul", _match, lambda g, node, m: _rewrite(g, node, *m))
    if count:
        log.info("%s: %d matmul(s) with their scale and offset fused", graph.path or "graph", count)
    return new


def _other(node: Node, v: Value) -> Value | None:
    """The operand of the binary `node` that is not `v` (None when `v` is both or the node is not binary)."""
    if len(node.inputs) != 2 or node.inputs[0] is node.inputs[1]:
        return None
    return node.inputs[1] if node.inputs[0] is v else node.inputs[0]


def _match(graph: Graph, mm: Node) -> tuple[float | None, Value | None, list[Node]] | None:
    """(scale, bias, the nodes after the MatMul) when they make an affine epilogue of it, else None."""
    y = mm.outputs[0]
    if len(mm.inputs) != 2 or len(mm.outputs) != 1 or y.dtype != np.float32 or y.shape is None:
        return None
    scale, bias, after = None, None, []
    nxt = single_consumer(graph, y)
    if nxt is not None and nxt.op_type == "Mul":
        k = _other(nxt, y)
        if k is None or not k.is_const or k.const.dtype != np.float32 or k.const.size != 1:
            return None
        if nxt.outputs[0].shape != y.shape:
            return None
        scale = float(k.const.reshape(-1)[0])
        after.append(nxt)
        y = nxt.outputs[0]
        nxt = single_consumer(graph, y)
    if nxt is not None and nxt.op_type == "Add":
        b = _other(nxt, y)
        if b is not None and b.is_const and b.const.dtype == np.float32 and nxt.outputs[0].shape == y.shape \
                and _broadcasts_into(b.const.shape, y.shape):
            bias = b
            after.append(nxt)
    return (scale, bias, after) if after else None


def _broadcasts_into(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(shape[::-1], target[::-1], strict=False))


def _rewrite(graph: Graph, mm: Node, scale: float | None, bias: Value | None, after: list[Node]) -> None:
    y = after[-1].outputs[0]
    for node in after:
        for v in node.inputs:
            while node in v.consumers:
                v.consumers.remove(node)
        graph.nodes.remove(node)
    mm.op_type = "MatMulAffine"
    mm.params = {**mm.params, "scale": scale, "has_bias": bias is not None}
    old = mm.outputs[0]
    old.producer = None
    mm.outputs[0] = y
    y.producer = mm
    if bias is not None:
        mm.inputs.append(bias)
        bias.consumers.append(mm)
