"""Compile a graph for one instance at its max shapes: which nodes run, the memory plan, the kernels.

Host values (constants, shape arithmetic) are never scheduled and never in the arena. Every other node is a
step; alias ops (reshape family) are steps for the planner but run no code, since their output view already
sits on their input's bytes.

Where the device's kernels read host memory (`Device.host_inputs`), the graph inputs are not in the arena: they
stay in the caller's arrays, bound per run (bind.py), and so do alias views of them. The arena then holds the
intermediates and the outputs only. No op runs in place on such an external value (it is the caller's memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from engine.devices.base import Device, Kernel
from engine.ir import Graph, Node, Value
from engine.memory.planner import MemoryPlan, Step, plan
from engine.ops.registry import OpDef, TensorInfo, get_op
from engine.passes.infer_shapes import const_info
from engine.runtime.extents import bounded_nodes, dependent_values


@dataclass
class CompiledNode:
    node: Node
    op: OpDef
    alias: bool  # output 0 is a view of input 0: nothing to run
    kernel: Kernel | None


@dataclass
class Compiled:
    nodes: list[CompiledNode]  # scheduled nodes, in execution order
    arena_values: list[Value]  # graph inputs first where they are copied in, then scheduled outputs
    external: list[Value]  # in the caller's memory: graph inputs first, then alias views of them, in order
    plan: MemoryPlan
    infos: dict[Value, TensorInfo]  # at the max shapes
    bounded: set[Node] = field(default_factory=set)  # kernels that report data-dependent extents (extents.py)
    dependent: set[Value] = field(default_factory=set)  # values computed from such an extent (extents.py)


def is_host(node: Node, infos: dict[Value, TensorInfo]) -> bool:
    return all(infos[v].value is not None for v in node.outputs)


def compile_graph(graph: Graph, infos: dict[Value, TensorInfo], device: Device) -> Compiled:
    scheduled = [n for n in graph.nodes if not is_host(n, infos)]
    dependent = dependent_values(graph, infos, device.ops)  # refuses a consumer that cannot follow an extent
    external = list(graph.inputs) if device.host_inputs else []
    arena_values = [] if device.host_inputs else list(graph.inputs)
    outside, in_arena = set(external), set(arena_values)
    steps, inplace, aliases, compiled = [], {}, {}, []
    for node in scheduled:
        op = get_op(node.op_type, node.name, node.where(), device.ops)
        alias = _can_alias(node, op, infos)
        if alias and node.inputs[0] in outside:
            external.append(node.outputs[0])  # a view of the caller's array, made per run
            outside.add(node.outputs[0])
            writes: tuple[Value, ...] = ()
        else:
            alias = alias and node.inputs[0] in in_arena
            arena_values += node.outputs
            in_arena.update(node.outputs)
            writes = tuple(node.outputs)
            if alias:
                aliases[node.outputs[0]] = node.inputs[0]
            elif op.inplace and _same_layout(node, infos, in_arena):
                inplace[node.outputs[0]] = node.inputs[0]
        steps.append(Step(tuple(v for v in node.inputs if v in in_arena), writes))
        compiled.append(CompiledNode(node, op, alias, None))
    sizes = {v: infos[v].nbytes for v in arena_values}
    memory = plan(steps, sizes, inputs=[v for v in graph.inputs if v in in_arena],
                  outputs=[v for v in graph.outputs if v in in_arena], inplace=inplace, aliases=aliases)
    for c in compiled:
        if not c.alias:
            c.kernel = device.build_kernel(c.node, c.op, input_infos(c.node, infos))
    workspace = max([_workspace(c, infos, device) for c in compiled], default=0)
    memory = replace(memory, workspace_bytes=workspace, weights_bytes=weights_bytes(graph))
    return Compiled(compiled, arena_values, external, memory, infos, bounded_nodes(scheduled, device.ops),
                    dependent)


def input_infos(node: Node, infos: dict[Value, TensorInfo]) -> list[TensorInfo]:
    return [const_info(v) if v.is_const else infos[v] for v in node.inputs]


def weights_bytes(graph: Graph) -> int:
    """Bytes of op attrs and const values (each array counted once)."""
    arrays = {id(a): a for n in graph.nodes for a in n.attrs.values() if hasattr(a, "nbytes")}
    arrays.update({id(v.const): v.const for v in graph.values() if v.is_const})
    return sum(int(a.nbytes) for a in arrays.values())


def _can_alias(node: Node, op: OpDef, infos) -> bool:
    if not op.alias or not node.inputs or len(node.outputs) != 1 or node.inputs[0].is_const:
        return False
    return infos[node.inputs[0]].nbytes == infos[node.outputs[0]].nbytes


def _same_layout(node: Node, infos, in_arena) -> bool:
    if not node.inputs or node.inputs[0] not in in_arena:
        return False
    a, b = infos[node.inputs[0]], infos[node.outputs[0]]
    return a.shape == b.shape and a.dtype == b.dtype


def _workspace(c: CompiledNode, infos, device: Device) -> int:
    if c.alias:
        return 0
    return device.workspace_bytes(c.node, c.op, input_infos(c.node, infos))
