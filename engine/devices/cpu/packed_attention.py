"""PackedAttention: an Attention whose q, k and v are the three thirds of one packed projection, read in place.

timm's and MobileViT's attention (and others written as `qkv(x).reshape(B, T, 3, H, D).permute(2, 0, 3, 1, 4)`,
then unbind) lower to

    x (B, T, 3, H, D) -> Transpose(2, 0, 3, 1, 4) -> Split(axis 0, three 1s) -> Squeeze(axis 0) x3
      -> Attention(q, k, v [, mask]) -> Transpose(0, 2, 1, 3) -> (B, T, H, D)

two copies of the whole qkv tensor and one of the output (DeiT-tiny: 36 of its nodes). `pack_attention` (the
CPU device's `prepare`) turns the chain into one PackedAttention(x [, mask]) -> (B, T, H, D) node with the
Attention's params: its kernel is Attention's, given q = x[:, :, 0] seen as (B, H, T, D) through strides (k and
v likewise) and the output seen as (B, H, T, D) through the strides of (B, T, H, D) (attention.py reads and
writes its operands in place through their strides). Only the chain exactly as above, every intermediate read
once by the next node and not a graph output, is rewritten; anything else stays as it is.
"""

from __future__ import annotations

import logging

import numpy as np

from engine.devices.cpu import attention
from engine.devices.cpu.kernel import Backends, CpuKernel
from engine.errors import ShapeError
from engine.ir import Graph, Node, Value
from engine.ops import OPS as OPS_SHARED
from engine.ops import attention as attention_op
from engine.ops.registry import OpDef, TensorInfo
from engine.passes.graph_edit import rewrite_on_copy, single_consumer

log = logging.getLogger("engine.passes")

_QKV_PERM = [2, 0, 3, 1, 4]  # (B, T, 3, H, D) -> (3, B, H, T, D)
_OUT_PERM = [0, 2, 1, 3]  # (B, H, T, D) -> (B, T, H, D)


# -- the op ---------------------------------------------------------------------------------------------------
def qkv_shape(node: Node, shape) -> tuple[int, ...]:
    """The (B, H, T, D) shape of each of q, k and v in an input (B, T, 3, H, D)."""
    shape = tuple(int(d) for d in shape)
    if len(shape) != 5 or shape[2] != 3:
        raise ShapeError(f"{node.where()}: PackedAttention takes a packed (B, T, 3, H, D) input, got {shape}")
    b, t, _, h, d = shape
    return b, h, t, d


def _infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) not in (1, 2):
        raise ShapeError(f"{node.where()}: PackedAttention takes x and an optional mask, got {len(ins)} inputs")
    qkv = TensorInfo(qkv_shape(node, ins[0].shape), ins[0].dtype)
    out = OPS_SHARED["Attention"].infer(node, [qkv, qkv, qkv, *ins[1:]])[0]
    return [TensorInfo(tuple(out.shape[i] for i in _OUT_PERM), out.dtype)]


def unpack(x: np.ndarray) -> list[np.ndarray]:
    """q, k, v (B, H, T, D): views of the packed (B, T, 3, H, D) input."""
    return [x[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]


def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    qkv_shape(node, arrays[0].shape)
    out = attention_op.reference(node, [*unpack(np.asarray(arrays[0])), *arrays[1:]])[0]
    return [np.ascontiguousarray(out.transpose(_OUT_PERM))]


OPS = {"PackedAttention": OpDef("PackedAttention", _infer, reference)}


# -- the kernel -----------------------------------------------------------------------------------------------
def _inner_infos(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    qkv = TensorInfo(qkv_shape(node, ins[0].shape), ins[0].dtype)
    return [qkv, qkv, qkv, *ins[1:]]


def build(backends: Backends, node: Node, ins: list[TensorInfo]):
    inner = attention.build(backends, node, _inner_infos(node, ins))

    def run(inputs, outputs, workspace):
        inner([*unpack(inputs[0]), *inputs[1:]], [outputs[0].transpose(_OUT_PERM)], workspace)

    run.impl = getattr(inner, "impl", "attention")  # type: ignore[attr-defined]
    if getattr(inner, "is_fallback", False):
        run.is_fallback = True  # type: ignore[attr-defined]
    return run


def _workspace(backends: Backends, node: Node, ins: list[TensorInfo]) -> int:
    return attention.KERNELS["Attention"].workspace(backends, node, _inner_infos(node, ins))


KERNELS = {"PackedAttention": CpuKernel(build, _workspace)}


# -- the rewrite ----------------------------------------------------------------------------------------------
class _Chain:
    """The nodes of one matched chain, from the packed input's Transpose to the output's Transpose."""

    def __init__(self, x: Value, nodes: list[Node], att: Node, out: Node):
        self.x, self.nodes, self.att, self.out = x, nodes, att, out


def pack_attention(graph: Graph) -> Graph:
    """A copy of `graph` with every matched chain one PackedAttention node, or `graph` itself when none matches
    (the graph is the Model's, shared with other instances: it is never edited)."""
    new, count = rewrite_on_copy(graph, "Attention", _match, lambda g, node, chain: _rewrite(g, chain))
    if count:
        log.info("%s: %d attention(s) read q, k, v in place from their packed projection", graph.path or "graph",
                 count)
    return new


def _match(graph: Graph, att: Node) -> _Chain | None:
    if len(att.inputs) not in (3, 4) or len(att.outputs) != 1 or len(set(map(id, att.inputs[:3]))) != 3:
        return None
    split = None
    squeezes = []
    for i, v in enumerate(att.inputs[:3]):
        sq = v.producer
        if sq is None or sq.op_type != "Squeeze" or list(sq.params.get("axes") or []) != [0] or len(sq.inputs) != 1:
            return None
        if single_consumer(graph, v) is not att or single_consumer(graph, sq.inputs[0]) is not sq:
            return None
        s = sq.inputs[0].producer
        if s is None or s.op_type != "Split" or (split is not None and s is not split):
            return None
        if len(s.outputs) != 3 or s.outputs[i] is not sq.inputs[0]:
            return None
        split = s
        squeezes.append(sq)
    if split is None or int(split.params.get("axis", 0)) != 0 or list(split.params.get("sizes") or []) != [1, 1, 1]:
        return None
    if len(split.inputs) != 1:
        return None
    perm = split.inputs[0].producer
    if perm is None or perm.op_type != "Transpose" or list(perm.params.get("perm") or []) != _QKV_PERM:
        return None
    if single_consumer(graph, split.inputs[0]) is not split:
        return None
    x = perm.inputs[0]
    if x.shape is None or len(x.shape) != 5 or x.shape[2] != 3 or x.dtype != np.float32:
        return None
    out = single_consumer(graph, att.outputs[0])
    if out is None or out.op_type != "Transpose" or list(out.params.get("perm") or []) != _OUT_PERM:
        return None
    return _Chain(x, [perm, split, *squeezes, att, out], att, out)


def _rewrite(graph: Graph, chain: _Chain) -> None:
    att, out = chain.att, chain.out
    y = out.outputs[0]
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    at = index[id(out)] - sum(index[id(n)] < index[id(out)] for n in chain.nodes)
    for node in reversed(chain.nodes):
        for v in node.outputs:
            v.producer = None
            v.consumers.clear()
        for v in node.inputs:
            while node in v.consumers:
                v.consumers.remove(node)
        graph.nodes.remove(node)
    graph.add_node("PackedAttention", [chain.x, *att.inputs[3:]], [y], name=att.name, params=att.params,
                   source=att.source, index=at)
