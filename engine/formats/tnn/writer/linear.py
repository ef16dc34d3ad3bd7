"""Writer rules for matrix products: Gemm -> InnerProduct (+ its activation), MatMul, and Attention written out as
Permute / MatMul / Mul / Add / SoftmaxCaffe / MatMul layers."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.writer.activations import activation
from engine.formats.tnn.writer.binary import one_const
from engine.formats.tnn.writer.core import Writer
from engine.formats.tnn.writer.registry import writes
from engine.ir import Node

F32 = np.float32


@writes("Gemm")
def gemm(w: Writer, node: Node) -> None:
    weight = node.attrs["weight"]
    n = weight.shape[0]
    bias = node.attrs.get("bias")
    bias = np.zeros(n, F32) if bias is None else bias  # TNN always stores an inner-product bias
    act, out = node.params.get("activation"), w.name(node.outputs[0])
    dst = out if act is None else w.tmp("gemm")
    rank = len(w.shape(node.inputs[0]))
    w.layer("InnerProduct", [w.name(node.inputs[0])], [dst], [n, 1, 0, rank - 1],
            [("name",), w.raw(weight), w.raw(bias)])
    if act is not None:
        activation(w, act, node.params.get("activation_params"), dst, out)


@writes("MatMul")
def matmul(w: Writer, node: Node) -> None:
    k, ins = one_const(w, node)
    out = [w.name(node.outputs[0])]
    if k is None:
        return w.layer("MatMul", ins, out, [-1])
    data = np.asarray(node.inputs[k].const, F32)
    if w.version == 1 and data.ndim != 2:
        w.unsupported("with a constant operand of rank != 2 in a v1 file")
    w.layer("MatMul", ins, out, [k], [w.raw(data, False)])


@writes("Attention")
def attention(w: Writer, node: Node) -> None:
    """softmax(q k^T * scale + mask) v, written out as TNN layers."""
    if node.params.get("is_causal") or (len(node.inputs) > 3 and node.inputs[3].dtype == np.bool_):
        w.unsupported("with a causal or boolean mask")
    q, k, v = node.inputs[:3]
    rank = len(w.shape(q))
    scale = node.params.get("scale") or 1.0 / np.sqrt(w.shape(q)[-1])
    kt, scores, scaled, probs = w.tmp("kt"), w.tmp("scores"), w.tmp("scaled"), w.tmp("probs")
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    w.layer("Permute", [w.name(k)], [kt], [rank, *perm], name=f"{node.name}/kt")
    w.layer("MatMul", [w.name(q), kt], [scores], [-1], name=f"{node.name}/qk")
    w.layer("Mul", [scores], [scaled], [1], [w.raw(F32(scale), False)], name=f"{node.name}/scale")
    if len(node.inputs) > 3:
        masked = w.tmp("masked")
        w.layer("Add", [scaled, w.name(node.inputs[3])], [masked], [-1], name=f"{node.name}/mask")
        scaled = masked
    w.layer("SoftmaxCaffe", [scaled], [probs], [rank - 1], name=f"{node.name}/softmax")
    w.layer("MatMul", [probs, w.name(v)], [w.name(node.outputs[0])], [-1], name=f"{node.name}/pv")
