"""Outputs whose size depends on the data (NonZero, NonMaxSuppression: `OpDef.extent_dims`).

The planner keeps planning every value at the max shapes: such an op's shape rule gives an upper bound, and its
arena slot holds that bound. At run time its kernel writes the actual result into the front of the slot and
returns the actual shapes; the instance then re-derives the shapes of everything downstream from them (a binding
per input shapes and reported extents, bind.py) and goes on with that binding's call list from the next call.
Shape rules are monotone, so the values downstream fit the slots planned at the bound.

That is only safe where every op downstream computes its output shape from its inputs' shapes at run time
(`OpDef.follows_extent`) and none was computed at load from the bound (a Shape of it, arithmetic on that): any
other consumer is refused at load here, naming the op, the node and its file and line.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from engine.errors import UnsupportedOpError
from engine.ir import Graph, Node, Value
from engine.ops.registry import OPS, OpDef, TensorInfo, get_op
from engine.passes.infer_shapes import infer_infos

PROBE = 224  # a dynamic input dim's stand-in when checking at load (as infer_shapes probes)


def bounded_nodes(nodes: list[Node], ops: Mapping[str, OpDef]) -> set[Node]:
    """The scheduled nodes whose kernels report their outputs' actual shapes."""
    return {n for n in nodes if get_op(n.op_type, n.name, n.where(), ops).extent_dims}


def dependent_outputs(graph: Graph, ops: Mapping[str, OpDef] = OPS) -> list[str]:
    """At load: the names of the graph outputs whose size depends on the data (a server cannot split those
    per request); refuses, as `dependent_values` does, a model with an op that could not follow such a size."""
    if not any(n.op_type in ops and ops[n.op_type].extent_dims for n in graph.nodes):
        return []  # the common case: no shape inference at load for nothing
    if any(v.shape is None or v.dtype is None for v in graph.inputs):
        return []  # nothing to infer from; the instance checks at its max shapes
    inputs = {v: TensorInfo(tuple(PROBE if d < 0 else d for d in v.shape), np.dtype(v.dtype)) for v in graph.inputs}
    dependent = dependent_values(graph, infer_infos(graph, inputs, strict=False, ops=ops), ops)
    return [v.name for v in graph.outputs if v in dependent]


def dependent_values(graph: Graph, infos: Mapping[Value, TensorInfo], ops: Mapping[str, OpDef]) -> set[Value]:
    """The values whose shape follows a data-dependent extent; raises UnsupportedOpError at the first node that
    could not take one."""
    origins: dict[Value, frozenset[Node]] = {}  # each such value: the data-dependent nodes its size comes from
    for node in graph.nodes:
        op = ops.get(node.op_type)
        sources = {origins[v] for v in node.inputs if v in origins}
        if sources:
            _check_follower(node, op, infos)
            if len(sources) > 1:
                _refuse_meeting(node, sources)
            (source,) = sources
            if op is not None and op.extent_dims:
                source = source | {node}
            origins.update((v, source) for v in node.outputs)
        elif op is not None and op.extent_dims and any(infos[v].value is None for v in node.outputs if v in infos):
            origins.update((v, frozenset({node})) for v, d in zip(node.outputs, op.extent_dims, strict=False)
                           if d is not None)
    return set(origins)


def _refuse_meeting(node: Node, sources: set[frozenset[Node]]) -> None:
    """Sizes reported by different data-dependent nodes can only be compared at run time, and the runtime binds
    the graph one reported size at a time: a node that combines them is refused (one mask indexing two tensors is
    one node after merge_extent_ops, so `boxes[keep] * scores[keep]` is not refused)."""
    names = sorted({f"{n.op_type} {n.name!r} ({n.where()})" for s in sources for n in s})
    raise UnsupportedOpError(f"{node.op_type} (combines values whose sizes come from different data-dependent "
                             f"ops: {', '.join(names)}; such sizes are known only at run time)", node.name,
                             node.where())


def _check_follower(node: Node, op: OpDef | None, infos: Mapping[Value, TensorInfo]) -> None:
    if all(v in infos and infos[v].value is not None for v in node.outputs):
        why = "computes at load from the upper bound of an input whose size depends on the data"
    elif op is None or not (op.follows_extent or op.extent_dims):
        why = ("takes an input whose size depends on the data (NonZero, NonMaxSuppression), but its output "
               "shape cannot follow a size known only at run time")
    else:
        return
    raise UnsupportedOpError(f"{node.op_type} ({why})", node.name, node.where())
