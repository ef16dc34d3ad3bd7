"""Binding: the flat call list for one set of input shapes, as views into the instance's arena.

Built once per input-shape signature and cached by the instance. Every arena value must fit the slot the
planner gave it at the max shapes (sizes are monotone in the input shape); otherwise ArenaOverflowError.

Values outside the arena (the graph inputs where the device reads host memory, and alias views of them) are
slots in the call lists that `attach` fills with the caller's arrays for one run and `detach` empties after it,
so a cached binding never keeps a request's memory alive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.devices.base import Kernel
from engine.errors import ArenaOverflowError, EngineError
from engine.ir import Graph, Node, Value
from engine.memory.arena import Arena
from engine.ops.registry import TensorInfo
from engine.runtime.compile import Compiled


@dataclass(frozen=True)
class ExternalView:
    """An alias view of an earlier external value (`parent`, an index into the external list), at this
    signature's shape and dtype."""

    parent: int
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass
class Bound:
    calls: list[tuple[Kernel, list[np.ndarray], list[np.ndarray]]]
    call_nodes: list[Node]  # parallel to calls, for error messages and tracing
    input_views: list[np.ndarray]  # arena views of the graph inputs where the device copies them in; else []
    outputs: list[list]  # [name, array] pairs: arena views or host arrays, copied out after a run
    offsets: list[tuple[int, ...]]  # parallel to calls: arena offsets of each call's outputs (tracing)
    views: list[ExternalView] = field(default_factory=list)  # external values after the graph inputs
    slots: list[tuple[list, int, int]] = field(default_factory=list)  # (list, index, external index) to fill

    def attach(self, arrays: Sequence[np.ndarray]) -> None:
        """Puts the caller's arrays (parallel to the graph inputs, as `inputs.host_input` made them) and the
        alias views of them into the call lists for one run."""
        values = list(arrays)
        for v in self.views:
            base = values[v.parent]
            values.append(base.reshape(v.shape) if base.dtype == v.dtype
                          else base.reshape(-1).view(v.dtype).reshape(v.shape))
        for target, index, k in self.slots:
            target[index] = values[k]

    def detach(self) -> None:
        for target, index, _ in self.slots:
            target[index] = None


def bind(graph: Graph, compiled: Compiled, arena: Arena, infos: dict[Value, TensorInfo]) -> Bound:
    views = {v: _view(v, compiled, arena, infos) for v in compiled.arena_values}
    external = {v: k for k, v in enumerate(compiled.external)}
    _check_inplace(compiled, infos)
    calls, nodes, offsets, slots = [], [], [], []
    for c in compiled.nodes:
        if c.alias:
            continue
        ins = [views[v] if v in views else None if v in external else _host(c.node, v, infos)
               for v in c.node.inputs]
        slots += [(ins, i, external[v]) for i, v in enumerate(c.node.inputs) if v in external]
        outs = [views[v] for v in c.node.outputs]
        calls.append((c.kernel, ins, outs))
        nodes.append(c.node)
        offsets.append(tuple(compiled.plan.offsets[v] for v in c.node.outputs))
    outputs = [[v.name, views[v] if v in views else None if v in external else _host(None, v, infos)]
               for v in graph.outputs]
    slots += [(pair, 1, external[v]) for pair, v in zip(outputs, graph.outputs, strict=True) if v in external]
    n_inputs = sum(1 for v in graph.inputs if v in external)
    aliases = [ExternalView(external[v.producer.inputs[0]], infos[v].shape, np.dtype(infos[v].dtype))
               for v in compiled.external[n_inputs:]]
    input_views = [views[v] for v in graph.inputs if v in views]
    return Bound(calls, nodes, input_views, outputs, offsets, aliases, slots)
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
