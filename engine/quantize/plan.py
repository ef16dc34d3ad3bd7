"""Which layers of a float graph become TNN int8 layers, and which blobs need a scale.

As TNN's quantization tool (tools/quantization/calibration.cc): convolutions, inner products, adds and concats
are quantized; a ReLU or max pooling reading an int8 blob is quantized too and shares its output's scale (the
tool's MergeBlobScale: the input blob takes the output blob's scale, back along a chain of such layers); average
pooling and every other layer stay float, with TNN's reformat layers (our TnnQuantize / TnnDequantize) between.
As TNN's converter does, a ReLU or ReLU6 right after a convolution (its only reader) is the convolution's fused
activation. Inner products read and write per-tensor scales (the tool merges their blobs' channels).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.ir import Graph, Node, Value

TIED = {"TnnQRelu", "TnnQPool"}  # int8 layers whose input blob takes their output blob's scale


@dataclass
class Int8Plan:
    kinds: dict[Node, str] = field(default_factory=dict)  # float node -> its TNN int8 op
    activation: dict[Node, tuple[str, Node]] = field(default_factory=dict)  # conv -> (relu | relu6, the act node)
    absorbed: set[Node] = field(default_factory=set)  # activation nodes folded into a conv
    int8: set[Value] = field(default_factory=set)  # blobs stored as int8
    per_tensor: set[Value] = field(default_factory=set)  # blobs with one scale whatever the option says
    scaled: list[Value] = field(default_factory=list)  # blobs that need a scale, in graph order

    def output_of(self, node: Node) -> Value:
        """The blob an int8 node writes (a conv's fused activation's output)."""
        act = self.activation.get(node)
        return act[1].outputs[0] if act else node.outputs[0]

    def tied_pairs(self) -> list[tuple[Value, Value]]:
        """(input, output) of the ReLUs and max pools whose input takes the output's scale, last first."""
        return [(n.inputs[0], n.outputs[0]) for n in reversed(list(self.kinds)) if self.kinds[n] in TIED]


def _static4(v: Value) -> bool:
    """A 4-D value whose C, H, W are known (the batch may be dynamic)."""
    return v.shape is not None and len(v.shape) == 4 and all(d is not None and d > 0 for d in v.shape[1:])


def _conv_ok(node: Node) -> bool:
    p, w = node.params, node.attrs.get("weight")
    if w is None or w.ndim != 4 or len(node.inputs) != 1 or p.get("activation") or p.get("auto_pad"):
        return False
    t, left, b, r = p.get("pads", (0, 0, 0, 0))
    dh, dw = p.get("dilation", (1, 1))
    return (p.get("pad_mode") or "zeros") == "zeros" and (t, left) == (b, r) and dh == dw and \
        _static4(node.inputs[0])


def _gemm_ok(node: Node) -> bool:
    w, x = node.attrs.get("weight"), node.inputs[0]
    return w is not None and w.ndim == 2 and len(node.inputs) == 1 and not node.params.get("activation") and \
        x.shape is not None and len(x.shape) == 2


def _pool_ok(node: Node) -> bool:
    p = node.params
    t, left, b, r = p.get("pads", (0, 0, 0, 0))
    return tuple(p.get("dilation", (1, 1))) == (1, 1) and (t, left) == (b, r) and not p.get("auto_pad") and \
        _static4(node.inputs[0])


def _fusable_activation(graph: Graph, node: Node) -> tuple[str, Node] | None:
    v = node.outputs[0]
    if len(v.consumers) != 1 or v in graph.outputs:
        return None
    act = v.consumers[0]
    if act.op_type == "Relu":
        return "relu", act
    if act.op_type == "Clip" and act.params.get("min") == 0 and act.params.get("max") == 6:
        return "relu6", act
    return None


def plan_int8(graph: Graph) -> Int8Plan:
    plan = Int8Plan()
    for node in graph.nodes:
        if node in plan.absorbed:
            continue
        kind = _kind(graph, node, plan)
        if kind is None:
            continue
        plan.kinds[node] = kind
        if kind == "TnnQConv":
            act = _fusable_activation(graph, node)
            if act is not None:
                plan.activation[node] = act
                plan.absorbed.add(act[1])
        out = plan.output_of(node)
        plan.int8.add(out)
        if kind == "TnnQInnerProduct":
            plan.per_tensor.update([node.inputs[0], out])
    seen: set[Value] = set()
    for node in graph.nodes:
        if node in plan.kinds:
            for v in [*node.inputs, plan.output_of(node)]:
                if v not in seen and not v.is_const:
                    seen.add(v)
                    plan.scaled.append(v)
    return plan


def _kind(graph: Graph, node: Node, plan: Int8Plan) -> str | None:
    op, ins = node.op_type, node.inputs
    if op == "Conv" and _conv_ok(node):
        return "TnnQConv"
    if op == "Gemm" and _gemm_ok(node):
        return "TnnQInnerProduct"
    any_int8 = any(v in plan.int8 for v in ins)
    if op == "Add" and len(ins) == 2 and any_int8 and all(_static4(v) and not v.is_const for v in ins) \
            and ins[0].shape == ins[1].shape:
        return "TnnQAdd"
    if op == "Relu" and ins[0] in plan.int8:
        return "TnnQRelu"
    if op == "MaxPool" and ins[0] in plan.int8 and _pool_ok(node):
        return "TnnQPool"
    if op == "Concat" and any_int8 and node.params.get("axis") in (1, -3) and \
            all(_static4(v) and not v.is_const for v in ins):
        return "TnnQConcat"
    return None


def dtype_of(v: Value) -> np.dtype:
    return np.dtype(v.dtype if v.dtype is not None else np.float32)
