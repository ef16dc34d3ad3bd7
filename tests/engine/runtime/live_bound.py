"""The in-place live-bytes bound of a compiled instance, from its step list alone (not the planner's figures).

The most bytes live at any one step, each stored value rounded up to the arena's 64-byte alignment, where
- graph inputs, and alias views of them, take no bytes: they stay in the caller's arrays;
- an alias op's output (reshape family, same size) is a view of its input: no bytes of its own;
- an in-place op's output takes its input's bytes when that input is stored, has the same size, is read by no
  later step and is no graph output;
- stored bytes live from the step that writes them to the last step that reads any value in them (a graph
  output's to the end).
No arena can be smaller than this; bench/memory.py reports it beside the arena.
"""

from __future__ import annotations

from dataclasses import dataclass

ALIGNMENT = 64


@dataclass
class Slot:
    nbytes: int
    first: int
    last: int
    holds_output: bool = False


def live_bound(compiled, graph) -> int:
    """The bound for `compiled` (engine.runtime.compile.Compiled: the scheduled nodes and their infos)."""
    steps = compiled.nodes
    infos = compiled.infos
    outputs = set(graph.outputs)
    last_read = {v: i for i, c in enumerate(steps) for v in c.node.inputs}
    last_read.update({v: len(steps) - 1 for v in graph.outputs})
    external = set(graph.inputs)
    slot_of: dict = {}
    slots: list[Slot] = []
    for i, c in enumerate(steps):
        node = c.node
        src = node.inputs[0] if node.inputs else None
        same = src is not None and not src.is_const and infos[src].nbytes == infos[node.outputs[0]].nbytes
        if c.op.alias and len(node.outputs) == 1 and same and (src in external or src in slot_of):
            out = node.outputs[0]
            if src in external:
                external.add(out)
            else:
                _join(slot_of[src], out, i, last_read, outputs)
                slot_of[out] = slot_of[src]
            continue
        for k, v in enumerate(node.outputs):
            s = slot_of.get(src) if k == 0 and c.op.inplace and same else None
            if s is None or s.last != i or s.holds_output:
                s = Slot(-(-infos[v].nbytes // ALIGNMENT) * ALIGNMENT, i, i)
                slots.append(s)
            _join(s, v, i, last_read, outputs)
            slot_of[v] = s
    return max((sum(s.nbytes for s in slots if s.first <= i <= s.last) for i in range(len(steps))), default=0)


def _join(s: Slot, v, step: int, last_read: dict, outputs: set) -> None:
    s.last = max(s.last, last_read.get(v, step))
    s.holds_output = s.holds_output or v in outputs
