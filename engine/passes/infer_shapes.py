"""Shape inference over a whole graph: every op's `infer` in order, from concrete input shapes.

`infer_infos` is the driver the runtime uses at the max and at each request's shapes; `infer_shapes` is the
pass that writes shapes and dtypes into the IR at the file's input shapes so later passes can read them.

Values whose data is known without running the graph (constants, shape arithmetic) come back with
`TensorInfo.value` set; the runtime treats them as host values and never schedules their producers.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from engine.errors import EngineError, ShapeError
from engine.ir import Graph, Node, Value
from engine.ops.registry import OPS, OpDef, TensorInfo, check_inputs, get_op
from engine.ops.rules import HOST_EVAL_MAX_ELEMENTS, elements


def const_info(v: Value) -> TensorInfo:
    return TensorInfo(tuple(v.const.shape), v.const.dtype, v.const)


def infer_infos(graph: Graph, inputs: Mapping[Value, TensorInfo], strict: bool = True,
                ops: Mapping[str, OpDef] = OPS,
                extents: Mapping[Value, tuple[int, ...]] | None = None) -> dict[Value, TensorInfo]:
    """TensorInfo of every value reachable from the graph inputs (consts included), the ops looked up in `ops`
    (a device's own: the shared registry and its private ops).

    `extents` gives the actual shapes of outputs whose size depends on the data (`OpDef.extent_dims`: their op
    infers an upper bound), as one run's kernels reported them: the values downstream follow from those.
    With strict=False a node that cannot be inferred (unknown op, bad shapes) is skipped with its dependents.
    """
    extents = extents or {}
    infos: dict[Value, TensorInfo] = dict(inputs)
    for node in graph.nodes:
        if not strict and not all(v.is_const or v in infos for v in node.inputs):
            continue
        try:
            ins = [_input_info(node, v, infos) for v in node.inputs]
            outs = infer_node(node, ins, ops)
        except EngineError:
            if strict:
                raise
            continue
        infos.update(zip(node.outputs, outs, strict=True))
        for v in node.outputs:
            if v in extents:
                infos[v] = TensorInfo(tuple(extents[v]), infos[v].dtype)
    for v in graph.outputs:
        if v.is_const:
            infos[v] = const_info(v)
    return infos


def infer_node(node: Node, ins: list[TensorInfo], ops: Mapping[str, OpDef] = OPS) -> list[TensorInfo]:
    op = get_op(node.op_type, node.name, node.where(), ops)
    check_inputs(op, node, ins)
    try:
        outs = list(op.infer(node, ins))
    except EngineError:
        raise
    except Exception as e:  # an infer function tripping over its inputs is a shape problem of this node
        shapes = ", ".join(str(i.shape) for i in ins)
        raise ShapeError(f"{node.where()}: cannot infer shapes of {node.op_type} node {node.name!r} "
                         f"from inputs ({shapes}): {type(e).__name__}: {e}") from e
    if len(outs) != len(node.outputs):
        raise ShapeError(f"{node.where()}: {node.op_type} node {node.name!r} has {len(node.outputs)} outputs "
                         f"but its op infers {len(outs)}")
    if ins and all(i.value is not None for i in ins) and any(o.value is None for o in outs):
        outs = _host_eval(node, op, ins, outs)
    return outs


def _input_info(node: Node, v: Value, infos: Mapping[Value, TensorInfo]) -> TensorInfo:
    if v.is_const:
        return const_info(v)
    try:
        return infos[v]
    except KeyError:
        raise EngineError(f"{node.where()}: input {v.name!r} of node {node.name!r} has no known shape "
                          "(not a graph input and not produced earlier)") from None


def _host_eval(node: Node, op, ins: list[TensorInfo], outs: list[TensorInfo]) -> list[TensorInfo]:
    """Runs the reference on known small inputs so shape arithmetic never reaches the arena."""
    sizes = [elements(i.shape) for i in (*ins, *outs)]
    if sum(sizes) > HOST_EVAL_MAX_ELEMENTS:  # big data stays a scheduled node (an Expand to a huge shape)
        return outs
    try:
        arrays = op.reference(node, [np.asarray(i.value) for i in ins])
    except Exception:  # not evaluable on the host: leave it to the scheduled kernel
        return outs
    if len(arrays) != len(outs) or any(np.shape(a) != o.shape for a, o in zip(arrays, outs, strict=True)):
        return outs
    return [TensorInfo(o.shape, o.dtype, np.asarray(a, dtype=o.dtype)) for a, o in zip(arrays, outs, strict=True)]


# Stand-ins for dynamic dims when annotating: two different sizes tell dynamic dims from static ones.
_PROBES = (224, 160)


def infer_shapes(graph: Graph, ops: Mapping[str, OpDef] = OPS) -> Graph:
    """Writes inferred shapes (-1 where a dim follows a dynamic input dim) and dtypes into the values."""
    runs: list[dict[Value, TensorInfo]] = []
    for probe in _PROBES:
        inputs = {}
        for v in graph.inputs:
            if v.shape is None or v.dtype is None:
                return graph  # nothing to start from
            inputs[v] = TensorInfo(tuple(probe if d < 0 else d for d in v.shape), np.dtype(v.dtype))
        # the second run also shrinks every data-dependent extent, so the dims that follow it come out -1 too
        extents = _probe_extents(graph, runs[0], ops) if runs else None
        runs.append(infer_infos(graph, inputs, strict=False, ops=ops, extents=extents))
        if all(d >= 0 for v in graph.inputs for d in v.shape) and not _probe_extents(graph, runs[0], ops):
            break
    for v, info in runs[0].items():
        if v.is_const or v in graph.inputs:
            continue
        other = runs[-1].get(v)
        if other is None or len(other.shape) != len(info.shape):
            continue
        v.shape = tuple(a if a == b else -1 for a, b in zip(info.shape, other.shape, strict=True))
        v.dtype = np.dtype(info.dtype)
    return graph


def _probe_extents(graph: Graph, infos: Mapping[Value, TensorInfo],
                   ops: Mapping[str, OpDef]) -> dict[Value, tuple[int, ...]]:
    """A stand-in actual shape, other than the bound, for each output whose extent depends on the data."""
    extents = {}
    for node in graph.nodes:
        op = ops.get(node.op_type)
        if op is None or not op.extent_dims:
            continue
        for v, dim in zip(node.outputs, op.extent_dims, strict=False):
            info = infos.get(v)
            if dim is None or info is None or info.value is not None:
                continue
            shape = list(info.shape)
            shape[dim] = 2 if shape[dim] == 1 else 1
            extents[v] = tuple(shape)
    return extents
