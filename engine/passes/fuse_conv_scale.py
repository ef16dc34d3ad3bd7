"""fuse_conv_scale: a Mul of a Conv's output by a per-output-channel (or scalar) constant is folded into the
conv's weights and bias, as a BatchNorm is (fuse_conv_bn): the layer scale of EfficientFormer, ConvNeXt and
PoolFormer blocks (`x + gamma * conv(h)`), so that the residual Add can then join the conv's epilogue.

Only a Conv with its weight in attrs and no activation (gamma * act(conv) is not a conv), whose output feeds
only the Mul and is not a graph output, and only a constant that broadcasts along the channel axis alone: its
shape, leading 1s dropped, is (C, 1, ..., 1) or all 1s, and the Mul's output has the conv's shape. Anything
else (a scale over spatial positions, a broadcast that grows the output, a non-float constant) is left alone.
"""

from __future__ import annotations

import numpy as np

from engine.ir import Graph, Node, Value
from engine.passes.fuse_conv_bn import fold_channel_affine
from engine.passes.graph_edit import NodeEdits, absorb_output, single_consumer


def fuse_conv_scale(graph: Graph) -> Graph:
    edits = NodeEdits(graph)
    for node in list(graph.nodes):
        if node.op_type != "Conv" or not edits.contains(node):
            continue
        if node.params.get("activation") or len(node.inputs) > 1 or "weight" not in node.attrs:
            continue
        mul = single_consumer(graph, node.outputs[0])
        if mul is None or mul.op_type != "Mul" or len(mul.inputs) != 2:
            continue
        scale = _channel_scale(node, mul)
        if scale is not None and fold_channel_affine(node, scale, np.zeros_like(scale)):
            absorb_output(graph, node, mul, edits)
    edits.apply()
    return graph


def _channel_scale(conv: Node, mul: Node) -> np.ndarray | None:
    """The Mul's constant as one factor per output channel, or None where it is not one."""
    y = conv.outputs[0]
    a, b = mul.inputs
    other: Value = b if a is y else a
    if other is y or not other.is_const or y.shape is None or mul.outputs[0].shape != y.shape:
        return None
    c = np.asarray(other.const)
    if c.dtype != y.dtype or not np.issubdtype(c.dtype, np.floating) or c.ndim > len(y.shape):
        return None
    n_out = int(conv.attrs["weight"].shape[0])
    dims = list(c.shape)
    while dims and dims[0] == 1 and len(dims) > len(y.shape) - 1:
        dims.pop(0)  # (1, C, 1, 1) -> (C, 1, 1); a constant of the output's rank has the batch axis first
    if all(d == 1 for d in dims):
        return np.full(n_out, float(c.reshape(-1)[0]))
    if len(dims) != len(y.shape) - 1 or dims[0] != n_out or any(d != 1 for d in dims[1:]):
        return None
    return c.reshape(-1).astype(np.float64)
