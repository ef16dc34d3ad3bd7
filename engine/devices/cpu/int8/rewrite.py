"""The int8 layout rewrite: TNN's int8 ops on NHWC values (the CPU device's `prepare`, with oneDNN on).

A pure graph -> graph function; the input graph is left untouched (it is the Model's). In the copy,
- every 4-D TnnQConv / TnnQAdd / TnnQPool / TnnQConcat (on channels) / TnnQUpsample becomes its NHWC twin
  (ops.py), and its int8 output is NHWC;
- a TnnQuantize feeding one of them quantizes straight into NHWC (Int8QuantizeNhwc), a TnnDequantize of an
  NHWC value reads it as such (Int8DequantizeNhwc): the float side stays NCHW, but where the dequantized value's
  only reader is a Transpose to channels-last (perm 0, 2, 3, 1: a detection head's), the two become one
  Int8DequantizeToNhwc writing the Transpose's output, and neither the NCHW float value nor the transpose is made;
  where such heads are each reshaped and all joined on axis 1 by one Concat (a detector's scores or boxes), the
  lot becomes one Int8DequantizeConcatNhwc writing the Concat's output (_joined_heads), or the output of a
  Softmax over its last axis that is the Concat's only reader (a detector's class scores: `softmax`); where its
  only reader is a float32 GlobalAvgPool of a 4-D map (a classifier's head), the two become one
  Int8DequantizeMeanNhwc writing the pool's output (MobileNetV2's 1280x7x7: the NCHW float map was written
  through a transpose, then read back);
- TnnQRelu is elementwise: it keeps its input's layout; where it alone reads a TnnQAdd's output, the add's
  twin does it (`relu`: max(q, 0) of its rounded output, exactly the two ops; ResNet's residual adds);
- any other reader of an NHWC value (and a graph output) gets an Int8ToNchw copy, one per value; an NCHW int8
  value entering a twin gets an Int8ToNhwc copy.
Int8ConvNhwc also learns whether its input can be negative (`src_unsigned`): values out of a ReLU (fused or
not), and pools and concats of such values, never are, and oneDNN then reads them as u8 (exact on every ISA).
A quantize read by convs only, whose sums stay far from 2**24 even on inputs up to 255 (a first conv on the image)
writes its values + 128 as uint8 (`zero_point`), and its convs read them as u8 with that zero point
(`src_zero_point`, conv.py), exactly the int8 values' sums.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from engine.devices.cpu.int8.ops import TWINS, nhwc_shape
from engine.devices.cpu.int8.requant import exact_u8_sums
from engine.ir import Graph, Node, Value
from engine.ops.shape import transpose_perm

log = logging.getLogger("engine.passes")

NHWC, NCHW = "nhwc", "nchw"
LAYOUT_FREE = {"TnnQRelu"}


@dataclass
class Int8LayoutStats:
    twins: int = 0
    to_nhwc: int = 0
    to_nchw: int = 0
    unsigned_convs: int = 0


def _int8_4d(v: Value) -> bool:
    return (v.shape is not None and len(v.shape) == 4 and v.shape[1] is not None and v.shape[1] >= 0
            and v.dtype is not None and np.dtype(v.dtype) == np.int8)


def _twin_of(node: Node) -> str | None:
    """The NHWC twin this node becomes, if any (structurally)."""
    op = node.op_type
    if op not in TWINS or op in ("TnnQuantize", "TnnDequantize"):
        return None
    if not all(_int8_4d(v) for v in [*node.inputs, *node.outputs]):
        return None
    if op == "TnnQConcat" and node.params.get("axis", 1) not in (1, -3):
        return None
    return TWINS[op]


def _to_channels_last(node: Node, graph: Graph) -> Node | None:
    """The Transpose (0, 2, 3, 1) that is the only reader of this TnnDequantize's output, if so."""
    out = node.outputs[0]
    if out in graph.outputs or len(out.consumers) != 1 or out.shape is None or len(out.shape) != 4:
        return None
    t = out.consumers[0]
    if t.op_type != "Transpose" or t.inputs != [out] or transpose_perm(t, 4) != [0, 2, 3, 1]:
        return None
    return t


def _global_mean_of(node: Node, graph: Graph) -> Node | None:
    """The float32 GlobalAvgPool of a 4-D map that is the only reader of this TnnDequantize's output, if so."""
    out = node.outputs[0]
    if out in graph.outputs or len(out.consumers) != 1 or out.shape is None or len(out.shape) != 4:
        return None
    g = out.consumers[0]
    if g.op_type != "GlobalAvgPool" or g.inputs != [out] or len(g.outputs) != 1:
        return None
    y = g.outputs[0]
    return g if y.dtype is not None and np.dtype(y.dtype) == np.float32 else None


def _only_reader(v: Value, graph: Graph) -> Node | None:
    if v in graph.outputs or len(v.consumers) != 1:
        return None
    return v.consumers[0]


def _head(v: Value, join: Node, graph: Graph) -> tuple[Node, Node, Node] | None:
    """(TnnDequantize, Transpose, Reshape) whose chain makes the Concat input `v`: a Reshape (N, ...) -> (N, -1,
    *trailing) of a channels-last dequantized int8 head, each link read by the next only."""
    r = v.producer
    if (r is None or r.op_type != "Reshape" or len(r.inputs) != 1 or set(r.params) != {"shape"}
            or _only_reader(v, graph) is not join):
        return None
    t = r.inputs[0].producer
    if t is None or t.op_type != "Transpose" or _only_reader(r.inputs[0], graph) is not r:
        return None
    dq = t.inputs[0].producer
    if dq is None or dq.op_type != "TnnDequantize" or _to_channels_last(dq, graph) is not t:
        return None
    src, shape = r.inputs[0].shape, list(r.params.get("shape", []))
    if src is None or v.shape is None or join.outputs[0].shape is None or None in src:
        return None
    # the batch stays the first dim (0: copied, or -1 with the rest fixed), each image's values become rows of
    # the join's trailing dims
    trailing = list(join.outputs[0].shape[2:])
    batch_kept = (shape[:1] == [0] and shape[1:2] != [0]) or (shape[:1] == [-1] and len(shape) > 1 and shape[1] > 0)
    if (not batch_kept or len(shape) != len(v.shape) or shape[2:] != trailing or any(d <= 0 for d in trailing)
            or int(np.prod(v.shape[1:])) != int(np.prod(src[1:]))):
        return None
    return dq, t, r


def _joined_heads(graph: Graph) -> dict[int, list[tuple[Node, Node, Node]]]:
    """id(Concat) -> its heads' chains, for every Concat on axis 1 whose inputs are all such heads."""
    found = {}
    for node in graph.nodes:
        out = node.outputs[0].shape if node.op_type == "Concat" and node.outputs else None
        if out is None or len(out) < 3 or node.params.get("axis") not in (1, 1 - len(out)):
            continue
        if len(set(map(id, node.inputs))) != len(node.inputs):
            continue
        heads = [_head(v, node, graph) for v in node.inputs]
        if all(h is not None for h in heads):
            found[id(node)] = heads
    return found


def _relu_of(add: Node, graph: Graph) -> Node | None:
    """The TnnQRelu that is the only reader of this TnnQAdd's output, if so (and itself an int8 4-D value)."""
    r = _only_reader(add.outputs[0], graph)
    if r is None or r.op_type != "TnnQRelu" or r.inputs != [add.outputs[0]] or not _int8_4d(r.outputs[0]):
        return None
    return r


def _softmax_of(join: Node, graph: Graph) -> Node | None:
    """The Softmax over the last axis that is the only reader of this Concat's output, if so."""
    out = join.outputs[0]
    s = _only_reader(out, graph)
    if s is None or s.op_type != "Softmax" or s.inputs != [out] or len(s.outputs) != 1:
        return None
    rank = len(out.shape)
    return s if int(s.params.get("axis", -1)) in (-1, rank - 1) else None


ZERO_POINT = 128


def _zero_pointed(node: Node) -> bool:
    """Whether this TnnQuantize's output may be written with a zero point: every reader a conv twin reading it as
    its input only, whose sums of u8 inputs are exact on oneDNN (requant.exact_u8_sums)."""
    out = node.outputs[0]
    readers = out.consumers
    if not _int8_4d(out) or not readers:
        return False
    for c in readers:
        if c.op_type != "TnnQConv" or _twin_of(c) is None or c.inputs[0] is not out or out in c.inputs[1:]:
            return False
        if not exact_u8_sums(np.asarray(c.attrs["weight"])):
            return False
    return True


def _reads_nhwc(node: Node) -> bool:
    return _twin_of(node) is not None or node.op_type in LAYOUT_FREE


def nonnegative_values(graph: Graph) -> set[Value]:
    """int8 values that can never be negative, whatever the input: a ReLU's output (fused into a conv unless an
    add follows it), and what max/avg pools and concats make of such values."""
    out: set[Value] = set()
    for node in graph.nodes:
        op, p = node.op_type, node.params
        if op == "TnnQConv":
            ok = p.get("activation") in ("relu", "relu6") and p.get("fusion") in (None, "add_then_act")
        elif op == "TnnQRelu":
            ok = True
        elif op in ("TnnQPool", "TnnQConcat"):
            ok = all(v in out for v in node.inputs)
        else:
            ok = False
        if ok:
            out.update(node.outputs)
    return out


def layout_nhwc(graph: Graph) -> tuple[Graph, Int8LayoutStats]:
    """The rewritten copy and its figures."""
    return _Rewrite(graph).run()


def decide(graph: Graph) -> Graph:
    """The rewritten copy when the graph has int8 ops to run in NHWC, else `graph` itself; logs what it did."""
    if not any(_twin_of(n) for n in graph.nodes):
        return graph
    new, stats = layout_nhwc(graph)
    log.info("%s: int8 NHWC layout: %d ops (%d convs on unsigned input), %d Int8ToNhwc, %d Int8ToNchw",
             graph.path or "graph", stats.twins, stats.unsigned_convs, stats.to_nhwc, stats.to_nchw)
    return new


class _Rewrite:
    def __init__(self, graph: Graph):
        self.src = graph
        self.new = Graph(path=graph.path, meta=dict(graph.meta), _names=graph._names)
        self.native: dict[Value, Value] = {}  # original value -> its copy, in the layout it is produced in
        self.layout: dict[Value, str] = {}
        self.other: dict[Value, Value] = {}  # original value -> its converted copy
        self.nonneg = nonnegative_values(graph)
        self.zero_pointed: set[Value] = set()  # quantized values written with ZERO_POINT (uint8)
        self.absorbed: set[int] = set()  # ids of the Transposes an Int8DequantizeToNhwc does
        self.joins = _joined_heads(graph)  # id(Concat) -> the heads it joins, done by one Int8DequantizeConcatNhwc
        self.absorbed.update(id(n) for heads in self.joins.values() for head in heads for n in head)
        self.stats = Int8LayoutStats()

    def run(self) -> tuple[Graph, Int8LayoutStats]:
        self.new.inputs = [self._produce(v, NCHW) for v in self.src.inputs]
        for node in self.src.nodes:
            self._node(node)
        self.new.outputs = [self._read(v, NCHW) for v in self.src.outputs]
        self.new.validate()
        return self.new, self.stats

    def _produce(self, v: Value, layout: str) -> Value:
        if v.is_const:
            copy = self.new.value(v.name, const=v.const)
        elif layout == NHWC:
            name = f"{v.name}.nhwc" if v in self.src.outputs else v.name
            copy = self.new.value(name, nhwc_shape(v.shape), v.dtype)
        else:
            copy = self.new.value(v.name, v.shape, v.dtype)
        self.native[v], self.layout[v] = copy, layout
        return copy

    def _read(self, v: Value, want: str) -> Value:
        if v not in self.native:  # a constant, or a value without producer
            self._produce(v, NCHW)
        if v.is_const or self.layout[v] == want:
            return self.native[v]
        if v not in self.other:
            self.other[v] = self._convert(v, want)
        return self.other[v]

    def _convert(self, v: Value, want: str) -> Value:
        if want == NCHW:
            out = self.new.value(v.name if v in self.src.outputs else f"{v.name}.nchw", v.shape, v.dtype)
            op = "Int8ToNchw"
            self.stats.to_nchw += 1
        else:
            out = self.new.value(f"{v.name}.nhwc", nhwc_shape(v.shape), v.dtype)
            op = "Int8ToNhwc"
            self.stats.to_nhwc += 1
        self.new.add_node(op, [self.native[v]], [out], name=f"{v.name}.to_{want}")
        return out

    def _node(self, node: Node) -> None:
        if id(node) in self.absorbed:
            return
        if id(node) in self.joins and self._join(node, self.joins[id(node)]):
            return
        op, params, node_outputs = node.op_type, dict(node.params), node.outputs
        twin = _twin_of(node)
        out_layout = NCHW
        if twin is not None:
            inputs = [self._read(v, NHWC) for v in node.inputs]
            op, out_layout = twin, NHWC
            self.stats.twins += 1
            relu = _relu_of(node, self.src) if twin == "Int8AddNhwc" else None
            if relu is not None:
                self.absorbed.add(id(relu))
                params["relu"] = True
                node_outputs = relu.outputs
            if twin == "Int8ConvNhwc":
                params["src_unsigned"] = node.inputs[0] in self.nonneg
                self.stats.unsigned_convs += params["src_unsigned"]
                if node.inputs[0] in self.zero_pointed:
                    params["src_zero_point"] = ZERO_POINT
        elif op == "TnnQuantize" and _int8_4d(node.outputs[0]) and any(
                _reads_nhwc(c) for c in node.outputs[0].consumers):
            inputs, op, out_layout = [self._read(node.inputs[0], NCHW)], "Int8QuantizeNhwc", NHWC
            self.stats.twins += 1
            if _zero_pointed(node) and node.outputs[0] not in self.src.outputs:
                params["zero_point"] = ZERO_POINT
                self.zero_pointed.add(node.outputs[0])
        elif op == "TnnDequantize" and node.inputs[0] in self.layout and self.layout[node.inputs[0]] == NHWC:
            inputs, op = [self.native[node.inputs[0]]], "Int8DequantizeNhwc"
            self.stats.twins += 1
            for reader_of, fused in ((_to_channels_last, "Int8DequantizeToNhwc"),
                                     (_global_mean_of, "Int8DequantizeMeanNhwc")):
                reader = reader_of(node, self.src)
                if reader is not None:  # the dequantize and its one reader as one op writing the reader's output
                    self.absorbed.add(id(reader))
                    self.new.add_node(fused, inputs, [self._produce(reader.outputs[0], NCHW)], name=node.name,
                                      params=params, attrs=dict(node.attrs), source=node.source)
                    return
        elif op in LAYOUT_FREE and node.inputs[0] in self.layout and self.layout[node.inputs[0]] == NHWC:
            inputs, out_layout = [self.native[node.inputs[0]]], NHWC
        else:
            inputs = [self._read(v, NCHW) for v in node.inputs]
        outputs = [self._produce(v, out_layout) for v in node_outputs]
        if params.get("zero_point"):
            outputs[0].dtype = np.dtype(np.uint8)
        self.new.add_node(op, inputs, outputs, name=node.name, params=params, attrs=dict(node.attrs),
                          source=node.source)

    def _join(self, concat: Node, heads: list[tuple[Node, Node, Node]]) -> bool:
        """The Concat of dequantized heads as one Int8DequantizeConcatNhwc, when every head's int8 value is NHWC;
        else the heads' nodes as they were, and False (the Concat then runs as it is)."""
        if all(self.layout.get(dq.inputs[0]) == NHWC for dq, _, _ in heads):
            inputs = [self.native[dq.inputs[0]] for dq, _, _ in heads]
            softmax = _softmax_of(concat, self.src)
            if softmax is not None:
                self.absorbed.add(id(softmax))
            out = (softmax or concat).outputs[0]
            self.new.add_node("Int8DequantizeConcatNhwc", inputs, [self._produce(out, NCHW)], name=concat.name,
                              params={"trailing": list(concat.outputs[0].shape[2:]), "softmax": softmax is not None},
                              attrs={"scales": [dq.attrs["scale"] for dq, _, _ in heads]}, source=concat.source)
            self.stats.twins += 1
            return True
        for head in heads:
            self.absorbed.difference_update(map(id, head))
        for head in heads:
            for node in head:
                self._node(node)
        return False
