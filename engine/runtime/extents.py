"""Outputs whose size depends on the data (NonZero, NonMaxSuppression: `OpDef.extent_dims`).

The planner keeps planning every value at the max shapes: such an op's shape rule gives an upper bound, and its
arena slot holds that bound. At run time its kernel writes the actual result into the front of the slot and
returns the actual shapes; the instance then re-derives the shapes of everything downstream from them (a binding
per input shapes and reported extents, bind.py) and goes on with that binding's call list from the next call.
Shape rules are monotone, so the values downstream fit the slots planned at the bound.

That is only safe where every op downstream computes its output shape from its inputs' shapes at run time
(`OpDef.follows_extent`), means the same at any smaller extent, and none was computed at load from the bound (a
Shape of it, arithmetic on that): any other consumer is refused at load here, naming the op, the node and its file
and line. Which dims of a value follow an extent is found by inferring the graph again with every extent shrunk
to 0 and to 1 (`PROBE_EXTENTS`): a dim that changes follows it. A node those probes cannot infer (a Reshape to a
fixed shape, a Squeeze of the data-dependent dim) would fail or change meaning at some run, so it is refused too;
RUN_CHECKED ops are the exception: torch raises where they fail (TopK's k above the extent, a max over no rows),
and so does that run. A value none of whose dims
follow an extent (a sum over the kept rows) is an ordinary value for its consumers.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from engine.errors import EngineError, UnsupportedOpError
from engine.ir import Graph, Node, Value
from engine.ops.registry import OPS, OpDef, TensorInfo, get_op
from engine.ops.rules import norm_axis
from engine.passes.infer_shapes import const_info, infer_infos, infer_node

PROBE = 224  # a dynamic input dim's stand-in when checking at load (as infer_shapes probes)
PROBE_EXTENTS = (0, 1)  # the actual sizes tried for every extent at load
# fail at a run whose extent they cannot take, as torch raises there (TopK: an extent below k; ReduceMax/Min: an
# empty one); not refused at load for what the probes show
RUN_CHECKED = {"TopK", "ReduceMax", "ReduceMin"}


def bounded_nodes(nodes: list[Node], ops: Mapping[str, OpDef]) -> set[Node]:
    """The scheduled nodes whose kernels report their outputs' actual shapes."""
    return {n for n in nodes if get_op(n.op_type, n.name, n.where(), ops).extent_dims}


def dependent_outputs(graph: Graph, ops: Mapping[str, OpDef] = OPS) -> list[str]:
    """At load: the names of the graph outputs computed from a value whose size depends on the data (a server
    cannot split those per request: their rows, or a sum over them, mix the whole batch); refuses, as
    `dependent_values` does, a model with an op that could not follow such a size."""
    if not any(n.op_type in ops and ops[n.op_type].extent_dims for n in graph.nodes):
        return []  # the common case: no shape inference at load for nothing
    if any(v.shape is None or v.dtype is None for v in graph.inputs):
        return []  # nothing to infer from; the instance checks at its max shapes
    inputs = {v: TensorInfo(tuple(PROBE if d < 0 else d for d in v.shape), np.dtype(v.dtype)) for v in graph.inputs}
    dependent = dependent_values(graph, infer_infos(graph, inputs, strict=False, ops=ops), ops)
    return [v.name for v in graph.outputs if v in dependent]


def dependent_values(graph: Graph, infos: Mapping[Value, TensorInfo], ops: Mapping[str, OpDef]) -> set[Value]:
    """The values computed from a data-dependent extent; raises UnsupportedOpError at the first node that could
    not take one."""
    if not any(n.op_type in ops and ops[n.op_type].extent_dims for n in graph.nodes):
        return set()
    probes = _probe_runs(graph, infos, ops)
    dependent: set[Value] = set()
    origins: dict[Value, frozenset[Node]] = {}  # a value whose dims follow extents: the nodes they come from
    for node in graph.nodes:
        op = ops.get(node.op_type)
        dims = [_varying_dims(v, infos, probes) if v in origins else set() for v in node.inputs]
        sources = {origins[v] for v, d in zip(node.inputs, dims, strict=True) if d}
        if sources:
            _check_follower(node, op, infos, probes)
            _check_chunks(node, dims, infos)
            if len(sources) > 1 and not _joins_along_extents(node, dims, infos):
                _refuse_meeting(node, sources)
        source = frozenset().union(*sources)
        if op is not None and op.extent_dims and any(infos[v].value is None for v in node.outputs if v in infos):
            source = source | {node}
        if source or any(v in dependent for v in node.inputs):
            dependent.update(node.outputs)
        if source:
            origins.update((v, source) for v in node.outputs if _varying_dims(v, infos, probes))
    return dependent


def _probe_runs(graph: Graph, infos: Mapping[Value, TensorInfo],
                ops: Mapping[str, OpDef]) -> list[dict[Value, TensorInfo]]:
    """The graph inferred with every extent shrunk to each of PROBE_EXTENTS (the max input shapes kept); a node
    that cannot be inferred is left out with its dependents, except a RUN_CHECKED one: it keeps its shapes at the
    bound (those of a run where it does not fail)."""
    runs = []
    for size in PROBE_EXTENTS:
        run = {v: infos[v] for v in graph.inputs if v in infos}
        for node in graph.nodes:
            if not all(v.is_const or v in run for v in node.inputs):
                continue
            try:
                outs = infer_node(node, [const_info(v) if v.is_const else run[v] for v in node.inputs], ops)
            except EngineError:
                if node.op_type not in RUN_CHECKED or not all(v in infos for v in node.outputs):
                    continue
                outs = [infos[v] for v in node.outputs]
            run.update(zip(node.outputs, outs, strict=True))
            op = ops.get(node.op_type)
            for v, dim in zip(node.outputs, op.extent_dims if op else (), strict=False):
                if dim is not None and v in infos and infos[v].value is None:
                    run[v] = TensorInfo(tuple(size if d == dim else n for d, n in enumerate(run[v].shape)),
                                        run[v].dtype)
        runs.append(run)
    return runs


def _varying_dims(v: Value, infos: Mapping[Value, TensorInfo], probes: list[dict[Value, TensorInfo]]) -> set[int]:
    """The dims of `v` that follow an extent (change with it); all of them where a probe could not infer `v`."""
    if v.is_const or v not in infos:
        return set()
    shape = infos[v].shape
    dims: set[int] = set()
    for run in probes:
        other = run.get(v)
        if other is None or len(other.shape) != len(shape):
            return set(range(max(len(shape), 1)))
        dims.update(d for d, (a, b) in enumerate(zip(shape, other.shape, strict=True)) if a != b)
    return dims


def _joins_along_extents(node: Node, dims: list[set[int]], infos: Mapping[Value, TensorInfo]) -> bool:
    """A Concat whose inputs vary only along its axis: the sizes add (a + b, a new extent), none must agree."""
    if node.op_type != "Concat" or node.inputs[0] not in infos:
        return False
    axis = norm_axis(node, int(node.params.get("axis", 0)), len(infos[node.inputs[0]].shape))
    return all(d <= {axis} for d in dims)


def _check_chunks(node: Node, dims: list[set[int]], infos: Mapping[Value, TensorInfo]) -> None:
    """torch.chunk along the data-dependent axis gives fewer pieces when few rows are kept (a Split into a fixed
    number of outputs cannot), so it is refused; fixed sizes along it fail the probes, other axes are fine."""
    if node.op_type != "Split" or node.params.get("sizes") is not None or node.inputs[0] not in infos:
        return
    if norm_axis(node, int(node.params.get("axis", 0)), len(infos[node.inputs[0]].shape)) in dims[0]:
        raise UnsupportedOpError(f"{node.op_type} (chunks along the axis whose size depends on the data: torch "
                                 "gives fewer pieces when few rows are kept)", node.name, node.where())


def _refuse_meeting(node: Node, sources: set[frozenset[Node]]) -> None:
    """Sizes reported by different data-dependent nodes can only be compared at run time, and the runtime binds
    the graph one reported size at a time: a node that combines them is refused (one mask indexing two tensors is
    one node after merge_extent_ops, so `boxes[keep] * scores[keep]` is not refused; a Concat along the
    data-dependent axis adds them and is not refused either)."""
    names = sorted({f"{n.op_type} {n.name!r} ({n.where()})" for s in sources for n in s})
    raise UnsupportedOpError(f"{node.op_type} (combines values whose sizes come from different data-dependent "
                             f"ops: {', '.join(names)}; such sizes are known only at run time)", node.name,
                             node.where())


def _check_follower(node: Node, op: OpDef | None, infos: Mapping[Value, TensorInfo],
                    probes: list[dict[Value, TensorInfo]]) -> None:
    if all(v in infos and infos[v].value is not None for v in node.outputs):
        why = ("reads the size of an input whose size depends on the data (x[mask].shape, size(), numel()): "
               "that size is known only at run time, but this computes at load from the upper bound of that input")
    elif op is None or not (op.follows_extent or op.extent_dims):
        why = ("takes an input whose size depends on the data (NonZero, NonMaxSuppression, x[mask]), but its "
               "output shape cannot follow a size known only at run time")
    elif node.op_type not in RUN_CHECKED and any(
            v in infos and (v not in run or len(run[v].shape) != len(infos[v].shape))
            for run in probes for v in node.outputs):
        why = ("takes an input whose size depends on the data, but cannot take every size it may have at run "
               "time (0 included): a fixed target shape or axis that only the upper bound fits (pnnx folds a "
               "view(-1, ...) to the traced shape unless exported with inputshape2)")
    else:
        return
    raise UnsupportedOpError(f"{node.op_type} ({why})", node.name, node.where())
