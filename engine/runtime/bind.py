"""Binding: the flat call list for one set of input shapes, as views into the instance's arena.

Built once per input-shape signature and cached by the instance. Every arena value must fit the slot the
planner gave it at the max shapes (sizes are monotone in the input shape); otherwise ArenaOverflowError.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.devices.base import Kernel
from engine.errors import ArenaOverflowError, EngineError
from engine.ir import Graph, Node, Value
from engine.memory.arena import Arena
from engine.ops.registry import TensorInfo
from engine.runtime.compile import Compiled


@dataclass
class Bound:
    calls: list[tuple[Kernel, list[np.ndarray], list[np.ndarray]]]
    call_nodes: list[Node]  # parallel to calls, for error messages and tracing
    input_views: list[np.ndarray]  # parallel to graph.inputs
    outputs: list[tuple[str, np.ndarray]]  # arena views or host arrays, copied out after a run
    offsets: list[tuple[int, ...]]  # parallel to calls: arena offsets of each call's outputs (tracing)


def bind(graph: Graph, compiled: Compiled, arena: Arena, infos: dict[Value, TensorInfo]) -> Bound:
    views = {v: _view(v, compiled, arena, infos) for v in compiled.arena_values}
    _check_inplace(compiled, infos)
    calls, nodes, offsets = [], [], []
    for c in compiled.nodes:
        if c.alias:
            continue
        ins = [views[v] if v in views else _host(c.node, v, infos) for v in c.node.inputs]
        outs = [views[v] for v in c.node.outputs]
        calls.append((c.kernel, ins, outs))
        nodes.append(c.node)
        offsets.append(tuple(compiled.plan.offsets[v] for v in c.node.outputs))
    outputs = [(v.name, views[v] if v in views else _host(None, v, infos)) for v in graph.outputs]
    return Bound(calls, nodes, [views[v] for v in graph.inputs], outputs, offsets)


def _view(v: Value, compiled: Compiled, arena: Arena, infos) -> np.ndarray:
    info, planned = infos[v], compiled.plan.sizes[v]
    if info.nbytes > planned:
        where = v.producer.where() if v.producer else "graph input"
        raise ArenaOverflowError(f"{where}: value {v.name!r} of shape {info.shape} needs {info.nbytes} bytes but "
                                 f"its slot was planned with {planned} at the max shapes "
                                 f"{compiled.infos[v].shape}; create the instance with larger max_shapes")
    if np.dtype(info.dtype) != np.dtype(compiled.infos[v].dtype):
        raise EngineError(f"value {v.name!r} changed dtype from {compiled.infos[v].dtype} to {info.dtype}")
    return arena.view(compiled.plan.offsets[v], info.shape, info.dtype, v.name)


def _host(node: Node | None, v: Value, infos) -> np.ndarray:
    if v.is_const:
        return v.const
    value = infos[v].value if v in infos else None
    if value is None:
        where = f"{node.where()}: " if node else ""
        raise EngineError(f"{where}value {v.name!r} is neither in the arena nor known on the host; its producer "
                          "was a host computation at the max shapes but not at these shapes")
    return np.asarray(value)


def _check_inplace(compiled: Compiled, infos) -> None:
    for out, src in compiled.plan.inplace.items():
        if infos[out].nbytes != infos[src].nbytes:
            raise EngineError(f"{out.producer.where()}: in-place output {out.name!r} {infos[out].shape} does not "
                              f"match its input {src.name!r} {infos[src].shape} at these shapes")
