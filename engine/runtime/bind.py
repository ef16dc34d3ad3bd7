"""Binding: the flat call list for one set of input shapes, as views into the instance's arena.

Built once per input-shape signature (and, after an op whose output size depends on the data, per actual size
it reported: extents.py) and cached by the instance. Every arena value must fit the slot the
planner gave it at the max shapes (sizes are monotone in the input shape); otherwise ArenaOverflowError.

Values outside the arena (the graph inputs where the device reads host memory, and alias views of them) are
slots in the call lists that `attach` fills with the caller's arrays for one run and `detach` empties after it,
so a cached binding never keeps a request's memory alive.

Where the device's kernels write host memory (`Device.host_outputs`), a graph output whose arena storage is one
value a kernel writes plus alias views of it (no in-place partner, no other graph output) is computed straight
into a fresh array the caller then owns: `attach_outputs` puts that array (and the alias views of it) into the
producer's output list and the consumers' input lists for one run, `detach` puts the arena views back. This
saves the copy out of the arena, which for a large output costs as much as the op that makes it (a 512 x 3199
conv1d output: 0.5 ms of either). Below DIRECT_MIN_BYTES the copy is cheaper than what a fresh array costs the
kernels that remember their buffers' addresses (a oneDNN primitive re-binds its memories, ~5 us a run), unless the
kernel writes it inside a native program (its kernel's `writes_fresh(view)`: the address is one word written before the
replay, devices/cpu/fused_calls.py): from NATIVE_DIRECT_MIN_BYTES then. The copy of a few hundred KB out of the
arena costs more than its size says: the output was just written by two cores, half of it in the other one's cache
(one-layer graphs, 2 vCPUs, a tight loop, us a run with and without the copy: a 3x3 depthwise conv over 672 x 7 x 7,
131 KB, between blocked layers 42 / 28; 20 x 56 x 56 76 / 66).
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

DIRECT_MIN_BYTES = 1 << 18  # smaller graph outputs are copied out of the arena (see above)
NATIVE_DIRECT_MIN_BYTES = 1 << 14  # ... from this size where the producing kernel writes them natively


@dataclass(frozen=True)
class ExternalView:
    """An alias view of an earlier external value (`parent`, an index into the external list), at this
    signature's shape and dtype."""

    parent: int
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass
class DirectOutput:
    """A graph output computed into a fresh caller-owned array: the arena views of its storage group (the value a
    kernel writes, and alias views of it) and where each sits in the call lists."""

    index: int  # in Bound.outputs
    members: list[tuple[np.ndarray, list[tuple[list, int]]]]  # (arena view, its (list, index) slots); root first
    output: int  # which member is the graph output

    def attach(self) -> np.ndarray:
        root = self.members[0][0]
        fresh = np.empty(root.shape, root.dtype)
        views = [fresh if k == 0 else _same_bytes(fresh, view) for k, (view, _) in enumerate(self.members)]
        for a, (_, slots) in zip(views, self.members, strict=True):
            for target, index in slots:
                target[index] = a
        return views[self.output]

    def detach(self) -> None:
        for view, slots in self.members:
            for target, index in slots:
                target[index] = view


def _same_bytes(base: np.ndarray, like: np.ndarray) -> np.ndarray:
    """`like`'s shape and dtype over `base`'s bytes (an alias view, as the arena gives it)."""
    if base.dtype == like.dtype:
        return base.reshape(like.shape)
    return base.reshape(-1).view(like.dtype).reshape(like.shape)


@dataclass
class Bound:
    calls: list[tuple[Kernel, list[np.ndarray], list[np.ndarray]]]
    call_nodes: list[Node]  # parallel to calls, for error messages and tracing
    input_views: list[np.ndarray]  # arena views of the graph inputs where the device copies them in; else []
    outputs: list[list]  # [name, array] pairs: arena views or host arrays, copied out after a run
    offsets: list[tuple[int, ...]]  # parallel to calls: arena offsets of each call's outputs (tracing)
    views: list[ExternalView] = field(default_factory=list)  # external values after the graph inputs
    slots: list[tuple[list, int, int]] = field(default_factory=list)  # (list, index, external index) to fill
    direct: list[DirectOutput] = field(default_factory=list)  # outputs computed into fresh arrays
    stops: list[int] = field(default_factory=list)  # calls whose kernels return data-dependent shapes (extents.py)
    # after the first run: [calls, first original index of each] with runs of calls merged by the device
    # (Device.fuse_calls), False where it merged none
    fused: list | bool | None = None
    runs: int = 0  # untraced runs of its own calls, until they are merged (instance.FUSE_AFTER_RUNS)

    def varying(self) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """Per call, what changes from run to run: (the indices of its inputs, those of its outputs) that are arrays
        new each run: the caller's (or alias views of them), or fresh ones a direct output is computed into; ((),
        ()) where every array is the same each run (arena views and host values only)."""
        new: dict[int, set[int]] = {}
        for target, index, _ in self.slots:
            new.setdefault(id(target), set()).add(index)
        for d in self.direct:
            for _, slots in d.members:
                for target, index in slots:
                    new.setdefault(id(target), set()).add(index)
        return [(tuple(sorted(new.get(id(ins), ()))), tuple(sorted(new.get(id(outs), ()))))
                for _, ins, outs in self.calls]

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

    def attach_outputs(self) -> None:
        """Fresh arrays for the direct outputs (also in `outputs`: the run's results, no copy needed)."""
        for d in self.direct:
            self.outputs[d.index][1] = d.attach()

    def detach(self) -> None:
        for target, index, _ in self.slots:
            target[index] = None
        for d in self.direct:
            d.detach()
            self.outputs[d.index][1] = d.members[d.output][0]

    def owned(self, index: int) -> bool:
        """Whether output `index` of this run is already the caller's own array (a direct output)."""
        return any(d.index == index for d in self.direct)


def bind(graph: Graph, compiled: Compiled, arena: Arena, infos: dict[Value, TensorInfo],
         host_outputs: bool = False) -> Bound:
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
    direct = _direct_outputs(graph, compiled, views, calls) if host_outputs else []
    stops = [i for i, node in enumerate(nodes) if node in compiled.bounded]
    return Bound(calls, nodes, input_views, outputs, offsets, aliases, slots, direct, stops)


def _direct_outputs(graph: Graph, compiled: Compiled, views: dict, calls) -> list[DirectOutput]:
    """The graph outputs a run may compute into fresh arrays: those whose storage group is one value a kernel
    writes plus alias views of it (no in-place partner), and holds no other graph output."""
    storage = compiled.plan.storage
    groups: dict = {}
    for v, root in storage.items():
        groups.setdefault(root, []).append(v)
    alias_outputs = {c.node.outputs[0] for c in compiled.nodes if c.alias}
    kernel_written = {v for c in compiled.nodes if not c.alias for v in c.node.outputs}
    direct = []
    for j, v in enumerate(graph.outputs):
        if v not in storage or v not in views or views[v].nbytes < NATIVE_DIRECT_MIN_BYTES:
            continue
        group = groups[storage[v]]
        written = [m for m in group if m not in alias_outputs]
        if (len(written) != 1 or written[0] not in kernel_written
                or sum(graph.outputs.count(m) for m in group) != 1):
            continue
        if views[v].nbytes < DIRECT_MIN_BYTES and not _writes_fresh(calls, views[written[0]]):
            continue
        ordered = written + [m for m in group if m in alias_outputs]
        members = [(views[m], [(lst, i) for _, ins, outs in calls for lst in (ins, outs)
                               for i, a in enumerate(lst) if a is views[m]]) for m in ordered]
        direct.append(DirectOutput(j, members, ordered.index(v)))
    return direct


def _writes_fresh(calls, view: np.ndarray) -> bool:
    """Whether the kernel that writes `view` writes a fresh array like it as cheaply as the arena's inside a native
    program (its `writes_fresh(view)`), so that an output from NATIVE_DIRECT_MIN_BYTES on is worth computing into
    one."""
    for fn, _, outs in calls:
        if any(a is view for a in outs):
            writes = getattr(fn, "writes_fresh", None)
            return writes is not None and bool(writes(view))
    return False


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
