"""fuse_conv_bn: a BatchNorm right after a Conv / ConvTranspose / Gemm is folded into its weights.

BatchNorm is stored folded (y = x * scale + bias per channel, channel axis 1), so the producer's output
channel o gets weight * scale[o] and bias * scale[o] + bn_bias[o].
"""

from __future__ import annotations

import numpy as np

from engine.ir import Graph, Node
from engine.passes.graph_edit import NodeEdits, absorb_output, single_consumer

_ANCHORS = {"Conv", "ConvTranspose", "Gemm"}


def fuse_conv_bn(graph: Graph) -> Graph:
    edits = NodeEdits(graph)
    for node in list(graph.nodes):
        if node.op_type in _ANCHORS and edits.contains(node):
            bn = single_consumer(graph, node.outputs[0])
            if bn is not None and bn.op_type == "BatchNorm" and _fusable(node, bn) and _fold(node, bn):
                absorb_output(graph, node, bn, edits)
    edits.apply()
    return graph


def _fusable(node: Node, bn: Node) -> bool:
    if node.params.get("activation") or len(node.inputs) > 1 or "weight" not in node.attrs:
        return False
    if "scale" not in bn.attrs or "bias" not in bn.attrs or bn.inputs[0] is not node.outputs[0]:
        return False
    if int(bn.params.get("axis", 1)) != 1:
        return False
    if node.op_type == "Gemm":  # BatchNorm's channel axis 1 is Gemm's feature axis only for 2-D outputs
        shape = node.outputs[0].shape
        return shape is not None and len(shape) == 2
    return True


def _fold(node: Node, bn: Node) -> bool:
    return fold_channel_affine(node, bn.attrs["scale"], bn.attrs["bias"])


def fold_channel_affine(node: Node, scale, shift) -> bool:
    """`node`'s output channel o becomes its output times scale[o] plus shift[o] (weights and bias rescaled in
    float64, stored in the weight's dtype). False, and the node unchanged, where a constant or a folded value is
    not finite in that dtype: 0 x inf in a weight (a zero tap times an infinite scale) gives NaN where the unfused
    graph gives inf, and a product that overflows the dtype gives inf where the unfused graph stays finite."""
    w = np.asarray(node.attrs["weight"], dtype=np.float64)
    scale = np.asarray(scale, dtype=np.float64).reshape(-1)
    shift = np.asarray(shift, dtype=np.float64).reshape(-1)
    n_out = _out_channels(node, w)
    scale = np.broadcast_to(scale, (n_out,))
    shift = np.broadcast_to(shift, (n_out,))
    bias = node.attrs.get("bias")
    bias = np.zeros(n_out) if bias is None else np.asarray(bias, dtype=np.float64)
    if not all(np.isfinite(a).all() for a in (w, bias, scale, shift)):
        return False
    if node.op_type == "ConvTranspose":
        groups = int(node.params.get("groups", 1))
        g = w.reshape(groups, w.shape[0] // groups, w.shape[1], *w.shape[2:])
        g = g * scale.reshape(groups, 1, w.shape[1], *([1] * (w.ndim - 2)))
        w = g.reshape(w.shape)
    else:
        w = w * scale.reshape(-1, *([1] * (w.ndim - 1)))
    dtype = np.asarray(node.attrs["weight"]).dtype
    with np.errstate(over="ignore"):  # float64 products of finite values, then the narrowing may overflow
        new_w, new_b = w.astype(dtype), (bias * scale + shift).astype(dtype)
    if not (np.isfinite(new_w).all() and np.isfinite(new_b).all()):
        return False
    node.attrs["weight"], node.attrs["bias"] = new_w, new_b
    return True


def _out_channels(node: Node, w: np.ndarray) -> int:
    if node.op_type == "ConvTranspose":
        return w.shape[1] * int(node.params.get("groups", 1))
    return w.shape[0]
