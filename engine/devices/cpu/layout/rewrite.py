"""The blocked-layout rewrite: keep activations in the blocked layout nChw{B}c between convolutions (CPU with oneDNN).

A pure graph -> graph function; the input graph is left untouched (it is the Model's, shared with instances on
other devices). The result is a copy (nodes and values new, weight arrays shared) where
- every float32 2-D zero-padded Conv whose groups fit the blocks becomes ConvBlocked when its input or output
  is blocked (a conv plain on both sides stays Conv, with whatever kernel Conv picks);
- a value is blocked when it can be (a ConvBlocked's output, or the output of a layout-agnostic op whose
  tensor inputs are all blocked) and some consumer wants it blocked (a ConvBlocked's src; its residual z when
  its output is blocked; a layout-agnostic op whose output is blocked) -- a fixpoint over the graph;
- a consumer that needs the other layout reads a ToPlain / ToBlocked of the value (one per value, shared);
  a ConvBlocked on a plain input with fewer than B channels (the image) reads it plain;
- graph inputs and outputs stay plain and keep their names.
Layout-agnostic ops: the activations (not PRelu: its slope runs along axis 1), Add/Sub/Mul/Maximum/Minimum on
blocked operands that share N and C (H, W may broadcast from 1) or scalar constants, and Concat on axis 1 when
every input but the last fills whole blocks; GlobalAvgPool / GlobalMaxPool / MaxPool (and ReduceMean over H and W
keeping dims) become GlobalPoolBlocked / MaxPoolBlocked (pooling per lane), a binary op broadcasting an
(N, C, 1, 1) operand becomes BroadcastBlocked, and Concat / Split on axis 1 and ChannelShuffle with other channel
counts become RegroupBlocked (lane copies; a Split's outputs are all blocked or all plain), chains of which are
composed into one node.
Values are physically (N, ceil(C/B), H, W, B), so the planner, binding and the agnostic ops' kernels work
unchanged.

`decide` applies the rewrite only when the reorders it inserts move fewer elements than the ones the plain
convolutions would do around themselves (src, dst, residual; the batch dimension counted as 1).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from engine.devices.cpu.layout.regroup import concat_sources, shuffle_sources, split_sources
from engine.ir import Graph, Node, Value

log = logging.getLogger("engine.passes")

UNARY = {"Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "Silu", "Gelu", "HardSwish", "HardSigmoid", "Elu",
         "Mish", "Softplus"}
BINARY = {"Add", "Sub", "Mul", "Maximum", "Minimum"}
# Ops that have a blocked twin: (op type on blocked values, params of the twin or None to keep the node's).
TWINS = {"GlobalAvgPool": ("GlobalPoolBlocked", {"mode": "avg"}),
         "GlobalMaxPool": ("GlobalPoolBlocked", {"mode": "max"}),
         "MaxPool": ("MaxPoolBlocked", None)}
# Global pools run blocked whenever their input is: a ToPlain of their (N, C, 1, 1) output is nearly free, while
# a plain input would make the conv before them write NCHW (ResNet-18's last conv: 7.4 -> 13 ms at batch 8).
SINKS = {"GlobalAvgPool", "GlobalMaxPool"}
# A ReduceMean over H and W that keeps dims (a squeeze-excite's torch.mean(x, (2, 3), keepdim=True)) is a global
# average pool: as GlobalPoolBlocked it spares a ToPlain before it and a ToBlocked after (GhostNet's seven SE blocks).
HW_MEANS = {"ReduceMean"}
CHANNEL_OPS = {"Concat", "Split", "ChannelShuffle"}  # become RegroupBlocked (regroup.py)
BLOCKED, PLAIN = "blocked", "plain"


@dataclass
class LayoutStats:
    convs: int = 0
    blocked_values: int = 0
    to_plain: int = 0
    to_blocked: int = 0
    reorder_elements: int = 0  # moved by the inserted reorders
    saved_elements: int = 0  # moved by the plain convs' own reorders, now gone

    @property
    def worth_it(self) -> bool:
        return self.convs > 0 and self.reorder_elements < self.saved_elements


def layout_blocked(graph: Graph, block: int) -> tuple[Graph, LayoutStats]:
    """The rewritten copy and its figures (applied unconditionally; see `decide`)."""
    blocked = _blocked_values(graph, block)
    return _Rewrite(graph, block, blocked).run()


def decide(graph: Graph, block: int) -> Graph:
    """The rewritten copy when it pays (stats.worth_it), else `graph` itself; logs the decision."""
    new, stats = layout_blocked(graph, block)
    verdict = "applied" if stats.worth_it else "skipped"
    log.info("%s: blocked layout (block %d) %s: %d convs, %d blocked values, %d ToPlain, %d ToBlocked, reorders "
             "%d elements instead of %d", graph.path or "graph", block, verdict, stats.convs, stats.blocked_values,
             stats.to_plain, stats.to_blocked, stats.reorder_elements, stats.saved_elements)
    return new if stats.worth_it else graph


# -- analysis ---------------------------------------------------------------------------------------------
def _f32_4d(v: Value) -> bool:
    return v.shape is not None and len(v.shape) == 4 and v.dtype is not None and np.dtype(v.dtype) == np.float32


def convertible_conv(node: Node, block: int) -> bool:
    if node.op_type != "Conv" or not node.inputs or not _f32_4d(node.inputs[0]) or not _f32_4d(node.outputs[0]):
        return False
    w = node.attrs.get("weight")
    if w is None or w.ndim != 4 or (node.params.get("pad_mode") or "zeros") != "zeros" or node.inputs[0].is_const:
        return False
    g = int(node.params.get("groups", 1) or 1)
    o, cpg = int(w.shape[0]), int(w.shape[1])
    # oneDNN's blocked kernels take dense convs, depthwise ones, and groups that fill whole blocks.
    return g == 1 or (cpg == 1 and o == g) or (cpg % block == 0 and (o // g) % block == 0)


def _hw_mean(node: Node) -> bool:
    """A ReduceMean of a 4-D value over axes 2 and 3 (negative or not) with keepdims."""
    if node.op_type not in HW_MEANS or len(node.inputs) != 1 or not node.params.get("keepdims", False):
        return False
    shape, axes = node.inputs[0].shape, node.params.get("axes")
    return shape is not None and len(shape) == 4 and bool(axes) and sorted(int(a) % 4 for a in axes) == [2, 3]


def _global_pool(node: Node) -> bool:
    return node.op_type in SINKS or _hw_mean(node)


def _tensor_inputs(node: Node) -> list[Value]:
    return [v for v in node.inputs if not (v.is_const and v.const.size == 1)]


def _agnostic(node: Node, block: int) -> bool:
    """Whether the node computes the same on blocked operands (structurally; blockedness is checked apart)."""
    if not node.outputs or not all(_f32_4d(v) for v in node.outputs):
        return False
    if len(node.outputs) > 1 and node.op_type != "Split":
        return False
    tensors = _tensor_inputs(node)
    if not tensors or not all(_f32_4d(v) and not v.is_const for v in tensors):
        return False
    if node.op_type in UNARY or node.op_type in TWINS or _hw_mean(node):
        return len(node.inputs) == 1
    if node.op_type in BINARY:
        out = node.outputs[0].shape
        return len(node.inputs) == 2 and all(_same_nc(v.shape, out) for v in tensors)
    if node.op_type in CHANNEL_OPS:  # RegroupBlocked takes any channel counts
        axis_ok = node.op_type == "ChannelShuffle" or node.params.get("axis") in (1, -3)
        return axis_ok and all(_known(v.shape[1]) for v in [*node.inputs, *node.outputs])
    return False


def _whole_blocks(node: Node, block: int) -> bool:
    """A Concat whose inputs but the last fill whole blocks: the plain Concat on the physical arrays is right."""
    return all(v.shape[1] % block == 0 for v in node.inputs[:-1])


def _known(d) -> bool:
    return d is not None and d >= 0


def _same_nc(shape, out) -> bool:
    """N and C as the output's, H and W equal or broadcast from 1."""
    return tuple(shape[:2]) == tuple(out[:2]) and all(a == b or a == 1 for a, b in zip(shape[2:], out[2:], strict=True))


def _spatial_broadcast(node: Node) -> bool:
    """Two tensor operands, one of them (N, C, 1, 1) against a larger H, W (a squeeze-excite scale)."""
    tensors = _tensor_inputs(node)
    if len(tensors) != 2:
        return False
    shapes = [tuple(v.shape[2:]) for v in tensors]
    return shapes[0] != shapes[1] and (1, 1) in shapes


def _wants_blocked(consumer: Node, v: Value, blocked: set[Value], convs: set[Node]) -> bool:
    if consumer in convs:
        return consumer.inputs[0] is v or consumer.outputs[0] in blocked
    return any(o in blocked for o in consumer.outputs)


def _wanted(v: Value, blocked: set[Value], convs: set[Node]) -> bool:
    """Some consumer of `v` (or of a sibling output: a Split's outputs share one layout) wants it blocked; a
    global pool's output is wanted as such (see SINKS)."""
    if v.producer is not None and _global_pool(v.producer):
        return True
    siblings = v.producer.outputs if v.producer is not None else [v]
    return any(_wants_blocked(c, s, blocked, convs) for s in siblings for c in s.consumers)


def _blocked_values(graph: Graph, block: int) -> set[Value]:
    convs = {n for n in graph.nodes if convertible_conv(n, block)}
    agnostic = [n for n in graph.nodes if _agnostic(n, block)]
    blocked: set[Value] = set()
    for node in graph.nodes:  # what can be blocked, in order
        if node in convs or (node in agnostic and all(v in blocked for v in _tensor_inputs(node))):
            blocked.update(node.outputs)
    changed = True
    while changed:  # drop values nobody wants blocked, and agnostic outputs with a plain input
        changed = False
        for v in list(blocked):
            if v in blocked and not _wanted(v, blocked, convs):
                blocked.difference_update(v.producer.outputs if v.producer is not None else [v])
                changed = True
        for node in agnostic:
            if node.outputs[0] in blocked and not all(v in blocked for v in _tensor_inputs(node)):
                blocked.difference_update(node.outputs)
                changed = True
    return blocked


# -- rewrite ----------------------------------------------------------------------------------------------
def compose_regroups(g: Graph) -> int:
    """Folds each RegroupBlocked whose one output feeds only another RegroupBlocked into that consumer (a
    Concat -> ChannelShuffle -> Split becomes one node, each element copied once). Returns how many went."""
    folded = 0
    for a in list(g.nodes):
        if a.op_type != "RegroupBlocked" or len(a.outputs) != 1:
            continue
        v = a.outputs[0]
        if v in g.outputs or len(v.consumers) != 1:
            continue
        b = v.consumers[0]
        if b.op_type != "RegroupBlocked":
            continue
        inputs = _Inputs()
        through = [(inputs.index(a.inputs[j], a.params["channels"][j]), c) for j, c in a.params["sources"][0]]
        b_index = [None if x is v else inputs.index(x, b.params["channels"][k]) for k, x in enumerate(b.inputs)]
        sources = [[through[c] if b_index[i] is None else (b_index[i], c) for i, c in out]
                   for out in b.params["sources"]]
        for x in b.inputs:
            x.consumers.remove(b)
        b.inputs = inputs.values
        for x in b.inputs:
            x.consumers.append(b)
        b.params = {**b.params, "channels": inputs.channels, "sources": sources}
        g.remove_node(a)
        folded += 1
    return folded


class _Inputs:
    """The inputs of a composed RegroupBlocked, each once, with its channel count."""

    def __init__(self):
        self.values: list[Value] = []
        self.channels: list[int] = []

    def index(self, v: Value, channels: int) -> int:
        for k, have in enumerate(self.values):
            if have is v:
                return k
        self.values.append(v)
        self.channels.append(channels)
        return len(self.values) - 1


def physical(shape, block: int) -> tuple[int, ...]:
    """Blocked physical shape of a logical NCHW shape (dynamic dims stay -1)."""
    n, c, h, w = shape
    return n, (-(-c // block) if _known(c) else -1), h, w, block


def _elements(shape) -> int:
    return math.prod(int(d) if _known(d) else 1 for d in shape[1:])


class _Rewrite:
    def __init__(self, graph: Graph, block: int, blocked: set[Value]):
        self.src, self.block, self.blocked = graph, block, blocked
        self.convs = {n for n in graph.nodes if convertible_conv(n, block)}
        self.new = Graph(path=graph.path, meta=dict(graph.meta), _names=graph._names)
        self.native: dict[Value, Value] = {}  # original value -> its copy in the layout it is produced in
        self.other: dict[Value, Value] = {}  # original value -> its converted copy
        self.stats = LayoutStats(blocked_values=len(blocked))

    def run(self) -> tuple[Graph, LayoutStats]:
        self.new.inputs = [self._produce(v) for v in self.src.inputs]
        for node in self.src.nodes:
            self._node(node)
        self.new.outputs = [self._read(v, PLAIN) for v in self.src.outputs]
        compose_regroups(self.new)
        self.new.validate()
        return self.new, self.stats

    def layout(self, v: Value) -> str:
        return BLOCKED if v in self.blocked else PLAIN

    def _produce(self, v: Value) -> Value:
        """The copy of `v` its producer writes; a blocked graph output yields its name to the ToPlain after it."""
        if v.is_const:
            copy = self.new.value(v.name, const=v.const)
        elif v in self.blocked:
            name = f"{v.name}.blocked" if v in self.src.outputs else v.name
            copy = self.new.value(name, physical(v.shape, self.block), v.dtype)
        else:
            copy = self.new.value(v.name, v.shape, v.dtype)
        self.native[v] = copy
        return copy

    def _read(self, v: Value, want: str) -> Value:
        if v not in self.native:  # a constant (or a value with no producer): plain, created on first use
            self._produce(v)
        if v.is_const or self.layout(v) == want:
            return self.native[v]
        if v not in self.other:
            self.other[v] = self._convert(v, want)
        return self.other[v]

    def _convert(self, v: Value, want: str) -> Value:
        to_plain = want == PLAIN
        if to_plain:
            out = self.new.value(v.name if v in self.src.outputs else f"{v.name}.plain", v.shape, v.dtype)
            self.stats.to_plain += 1
        else:
            out = self.new.value(f"{v.name}.blocked", physical(v.shape, self.block), v.dtype)
            self.stats.to_blocked += 1
        self.stats.reorder_elements += _elements(v.shape)
        self.new.add_node("ToPlain" if to_plain else "ToBlocked", [self.native[v]], [out],
                          name=f"{v.name}.{'to_plain' if to_plain else 'to_blocked'}",
                          params={"block": self.block, "channels": int(v.shape[1])})
        return out

    def _node(self, node: Node) -> None:
        params, op = dict(node.params), node.op_type
        if node in self.convs and (node.inputs[0] in self.blocked or node.outputs[0] in self.blocked):
            op, inputs = "ConvBlocked", self._conv_inputs(node, params)
        elif node.outputs and node.outputs[0] in self.blocked:
            inputs = [self._read(v, BLOCKED) for v in node.inputs]
            if op == "Concat" and _whole_blocks(node, self.block):
                params["axis"] = 1  # the block axis; -3 would now be H
            elif op in CHANNEL_OPS:
                op, params = "RegroupBlocked", self._regroup_params(node)
            if op in TWINS:
                op, twin_params = TWINS[op]
                params = dict(twin_params) if twin_params is not None else params
            elif _hw_mean(node):
                op, params = "GlobalPoolBlocked", {"mode": "avg"}
            elif op in BINARY and _spatial_broadcast(node):
                op, params = "BroadcastBlocked", {"op": op}
        else:
            inputs = [self._read(v, PLAIN) for v in node.inputs]
        outputs = [self._produce(v) for v in node.outputs]
        self.new.add_node(op, inputs, outputs, name=node.name, params=params, attrs=dict(node.attrs),
                          source=node.source)

    def _regroup_params(self, node: Node) -> dict:
        """RegroupBlocked's params: logical channel counts from the (known) value shapes."""
        chans = [int(v.shape[1]) for v in node.inputs]
        if node.op_type == "Concat":
            sources = concat_sources(chans)
        elif node.op_type == "Split":
            sources = split_sources([int(v.shape[1]) for v in node.outputs])
        else:
            sources = shuffle_sources(chans[0], int(node.params["groups"]))
        return {"block": self.block, "channels": chans, "sources": sources}

    def _conv_inputs(self, node: Node, params: dict) -> list[Value]:
        x, y = node.inputs[0], node.outputs[0]
        channels = x.shape[1]
        dst_blocked = y in self.blocked
        src_blocked = x in self.blocked or (dst_blocked and (not _known(channels) or channels >= self.block))
        params.update(src_blocked=src_blocked, dst_blocked=dst_blocked, block=self.block)
        self.stats.convs += 1
        self.stats.saved_elements += (_elements(x.shape) if src_blocked else 0) + (
            _elements(y.shape) * len(node.inputs) if dst_blocked else 0)
        inputs = [self._read(x, BLOCKED if src_blocked else PLAIN)]
        return inputs + [self._read(z, BLOCKED if dst_blocked else PLAIN) for z in node.inputs[1:]]
