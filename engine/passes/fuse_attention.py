"""fuse_attention: attention written out as ops becomes one Attention node, so a device runs it fused.

The pattern is softmax(q·kᵀ·scale + mask)·v as timm's, Hugging Face's eager, MobileViT's, EfficientFormer's and
Swin's window code write it, after lowering:

    MatMul(q', kᵀ) -> [Mul/Div by scalar constants] -> [Add(mask)] -> Softmax(last axis) -> MatMul(·, v)

where q' may be q times a scalar constant (timm scales q first) and kᵀ is a Transpose of k (its last two axes
swapped, possibly with others: (N, S, H, D) permuted to (N, H, D, S)) or any value (then a Transpose is added).
The mask is any tensor that broadcasts into the scores (a padding mask, a causal mask, a relative position
bias). Every intermediate must feed only the next op of the chain and not be a graph output (attention weights
that are also returned stay unfused). The node gets masked_rows="nan": an explicit softmax of a row of -inf is
NaN, and that is what the model computed.
"""

from __future__ import annotations

from engine.ir import Graph, Node, Value
from engine.passes.graph_edit import NodeEdits, single_consumer

_SCALES = {"Mul", "Div"}


def fuse_attention(graph: Graph) -> Graph:
    edits = NodeEdits(graph)
    for node in list(graph.nodes):
        if node.op_type == "Softmax" and edits.contains(node):
            match = _match(graph, node)
            if match is not None:
                _rewrite(graph, match, edits)
    edits.apply()
    return graph


class _Match:
    def __init__(self, softmax: Node, pv: Node):
        self.softmax, self.pv = softmax, pv
        self.chain: list[Node] = []  # the nodes the Attention node replaces, MatMul(q, kᵀ) last
        self.scale = 1.0
        self.mask: Value | None = None
        self.q = self.kt = None


def _match(graph: Graph, softmax: Node) -> _Match | None:
    p = softmax.outputs[0]
    if not _last_axis(softmax, p):
        return None
    pv = single_consumer(graph, p)
    if pv is None or pv.op_type != "MatMul" or pv.inputs[0] is not p or pv.inputs[1] is p:
        return None
    x = softmax.inputs[0]
    add = x.producer
    if add is not None and add.op_type == "Add" and len(add.inputs) == 2 and single_consumer(graph, x) is softmax:
        for scores, mask in (add.inputs, add.inputs[::-1]):  # which operand is the mask: the one the chain is not
            if scores is mask or not _float(mask) or not _broadcasts_into(mask, scores) or scores.shape != x.shape:
                continue
            m = _Match(softmax, pv)
            m.chain.append(add)
            m.mask = mask
            if _scores(graph, m, scores, add):
                return m
        return None
    m = _Match(softmax, pv)
    return m if _scores(graph, m, x, softmax) else None


def _scores(graph: Graph, m: _Match, x: Value, reader: Node) -> bool:
    """Follows the scores up from `x` (read by `reader`) through scalar scalings to MatMul(q, kᵀ), filling `m`."""
    while True:
        node = x.producer
        if node is None or single_consumer(graph, x) is not reader:
            return False
        reader = node
        if node.op_type == "MatMul":
            m.chain.append(node)
            m.q, m.kt = node.inputs
            break
        factor = _scalar_factor(node)
        if factor is None:
            return False
        m.chain.append(node)
        m.scale *= factor
        x = node.inputs[0] if node.op_type == "Div" else _chain_input(node, _const_operand(node))
    m.q = _unscaled(graph, m, m.q)
    return _ranks_ok(m.q, m.kt, m.pv.inputs[1])


def _last_axis(softmax: Node, p: Value) -> bool:
    if p.shape is None:
        return False
    axis = int(softmax.params.get("axis", -1))
    return axis in (-1, len(p.shape) - 1)


def _chain_input(node: Node, other: Value) -> Value:
    return node.inputs[1] if node.inputs[0] is other else node.inputs[0]


def _const_operand(node: Node) -> Value:
    return next(v for v in node.inputs if v.is_const)


def _scalar_factor(node: Node) -> float | None:
    """The factor Mul(x, c) / Mul(c, x) / Div(x, c) applies, for a one-element float constant c; else None."""
    if node.op_type not in _SCALES or len(node.inputs) != 2:
        return None
    consts = [v for v in node.inputs if v.is_const]
    if len(consts) != 1 or consts[0].const.size != 1 or consts[0].const.dtype.kind != "f":
        return None
    if node.op_type == "Div" and node.inputs[1] is not consts[0]:
        return None
    c = float(consts[0].const.reshape(()))
    if c == 0.0:
        return None
    return c if node.op_type == "Mul" else 1.0 / c


def _unscaled(graph: Graph, m: _Match, q: Value) -> Value:
    """q before a scalar Mul that only the score MatMul reads (timm: q = q * scale), folding it into the scale."""
    node = q.producer
    factor = None if node is None else _scalar_factor(node)
    if factor is None or single_consumer(graph, q) is None or node.op_type != "Mul":
        return q
    m.chain.append(node)
    m.scale *= factor
    return _chain_input(node, _const_operand(node))


def _float(v: Value) -> bool:
    return v.dtype is not None and v.dtype.kind == "f"


def _broadcasts_into(mask: Value, scores: Value) -> bool:
    """Whether the mask broadcasts into the scores (and not the scores into a wider mask)."""
    s, a = scores.shape, mask.shape
    if s is None or a is None or len(a) > len(s):
        return False
    return all(d == 1 or d == e for d, e in zip(a[::-1], s[::-1], strict=False))


def _ranks_ok(q: Value, kt: Value, v: Value) -> bool:
    shapes = [x.shape for x in (q, kt, v)]
    return all(s is not None and len(s) >= 2 for s in shapes)


def _rewrite(graph: Graph, m: _Match, edits: NodeEdits) -> None:
    k = _untransposed(graph, m.kt, m.pv, edits)
    inputs = [m.q, k, m.pv.inputs[1]] + ([m.mask] if m.mask is not None else [])
    out = m.pv.outputs[0]
    m.pv.outputs = [graph.value()]
    att = graph.add_node("Attention", inputs, [out], name=m.pv.name, source=m.pv.source,
                         params={"scale": m.scale, "is_causal": False, "masked_rows": "nan"})
    edits.insert_before(att, m.pv)
    for node in [m.pv, m.softmax, *m.chain]:
        graph.unlink(node)
        edits.remove(node)


def _untransposed(graph: Graph, kt: Value, pv: Node, edits: NodeEdits) -> Value:
    """k as (…, S, E) from kᵀ: the Transpose's input when it only swapped the last two axes, else one Transpose
    (composed with the one that made kᵀ, when there is one)."""
    node = kt.producer
    rank = len(kt.shape)
    swap = list(range(rank - 2)) + [rank - 1, rank - 2]
    if node is not None and node.op_type == "Transpose" and node.params.get("perm") is not None:
        perm = [int(p) % rank for p in node.params["perm"]]
        composed = [perm[i] for i in swap]
        if composed == list(range(rank)):
            return node.inputs[0]
        src = node.inputs[0]
        return _before(edits, pv, graph.add_node("Transpose", [src], 1, params={"perm": composed},
                                                 source=node.source))
    return _before(edits, pv, graph.add_node("Transpose", [kt], 1, params={"perm": swap}))


def _before(edits: NodeEdits, pv: Node, node: Node) -> Value:
    edits.insert_before(node, pv)
    return node.outputs[0]
