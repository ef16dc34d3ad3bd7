"""fuse_epilogue: Conv / ConvTranspose / Gemm absorb a following activation into their `activation` param, and
a Conv or Gemm absorbs a following Add of a same-shape tensor as its residual input (then maybe an activation):
the transformer's `x + proj(h)` becomes one matmul whose epilogue adds x.

Only when the intermediate has one consumer and is not a graph output; the fused node keeps the last
node's output value, so output names do not change.
"""

from __future__ import annotations

from engine.ir import Graph, Node
from engine.passes.graph_edit import NodeEdits, absorb_output, single_consumer

_ANCHORS = {"Conv", "ConvTranspose", "Gemm"}

# canonical activation op -> (epilogue name, params carried over)
ACTIVATIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "Relu": ("relu", ()),
    "Clip": ("clip", ("min", "max")),
    "LeakyRelu": ("leaky_relu", ("alpha",)),
    "Sigmoid": ("sigmoid", ()),
    "Silu": ("silu", ()),
    "HardSwish": ("hardswish", ("alpha", "beta")),
    "HardSigmoid": ("hardsigmoid", ("alpha", "beta")),
    "Gelu": ("gelu", ("approximate",)),
    "Tanh": ("tanh", ()),
    "Elu": ("elu", ("alpha",)),
}


def fuse_epilogue(graph: Graph) -> Graph:
    edits = NodeEdits(graph)
    for node in list(graph.nodes):
        if node.op_type not in _ANCHORS or not edits.contains(node):
            continue
        if node.op_type in ("Conv", "Gemm"):
            _fuse_residual(graph, node, edits)
        _fuse_activation(graph, node, edits)
    edits.apply()
    return graph


def _fuse_activation(graph: Graph, node: Node, edits: NodeEdits) -> None:
    act = single_consumer(graph, node.outputs[0])
    if act is None or act.op_type not in ACTIVATIONS or node.params.get("activation"):
        return
    if len(act.inputs) != 1 or act.inputs[0] is not node.outputs[0]:
        return
    name, keys = ACTIVATIONS[act.op_type]
    params = {k: act.params[k] for k in keys if k in act.params}
    if name == "clip" and params.get("min") == 0 and params.get("max") == 6:
        name, params = "relu6", {}
    node.params["activation"] = name
    node.params["activation_params"] = params
    absorb_output(graph, node, act, edits)


def _fuse_residual(graph: Graph, node: Node, edits: NodeEdits) -> None:
    add = single_consumer(graph, node.outputs[0])
    if add is None or add.op_type != "Add" or len(add.inputs) != 2 or len(node.inputs) != 1:
        return
    if node.params.get("activation"):
        return  # act(conv) + z is not act(conv + z)
    y = node.outputs[0]
    other = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
    if other is y or y.shape is None or other.shape != y.shape or add.outputs[0].shape != y.shape:
        return
    if other.dtype != y.dtype:
        return
    absorb_output(graph, node, add, edits)
    node.inputs.append(other)
    other.consumers.append(node)
