"""The int8 graph: the float graph with its planned layers replaced by TNN's int8 ops (engine/ops/quant.py), blob
scales attached, and TnnQuantize / TnnDequantize where int8 and float layers meet. The TNN writer writes it as
TNN's tool would (Quantized* layers, `<blob>_scale_data_` resources, no layer for the conversions); blob names
are the float graph's, so the written model's blobs can be compared with the float ones."""

from __future__ import annotations

import numpy as np

from engine.ir import Graph, Node, Value
from engine.quantize.plan import Int8Plan
from engine.quantize.weights import quantize_conv, quantize_inner_product

F32 = np.float32
I8 = np.dtype(np.int8)


class _Builder:
    def __init__(self, src: Graph, plan: Int8Plan, scales: dict[Value, np.ndarray], per_channel_weights: bool,
                 means: dict[Value, np.ndarray] | None):
        self.src, self.plan, self.scales, self.per_channel = src, plan, scales, per_channel_weights
        self.means = means or {}
        self.new = Graph(path=src.path, meta={**src.meta, "format": "canonical"})
        self.float: dict[Value, Value] = {}  # source value -> its float copy
        self.int8: dict[Value, Value] = {}  # source value -> its int8 copy
        self.outputs = set(src.outputs)

    def run(self) -> Graph:
        self.new.inputs = [self._float_value(v) for v in self.src.inputs]
        for node in self.src.nodes:
            if node in self.plan.absorbed:
                continue
            kind = self.plan.kinds.get(node)
            if kind is None:
                self._copy(node)
            else:
                getattr(self, f"_{kind}")(node)
        self.new.outputs = [self._as_float(v) for v in self.src.outputs]
        self.new.validate()
        return self.new

    # -- values ---------------------------------------------------------------------------------------------
    def _float_value(self, v: Value, name: str | None = None) -> Value:
        if v.is_const:
            return self.new.value(v.name, const=v.const)
        copy = self.new.value(name or v.name, v.shape, v.dtype)
        self.float[v] = copy
        return copy

    def _as_float(self, v: Value) -> Value:
        if v.is_const and v not in self.float:
            self.float[v] = self.new.value(v.name, const=v.const)
        if v not in self.float:  # an int8 blob read by a float layer (or a graph output): TNN's reformat
            q, output = self.int8[v], v in self.outputs
            if output:  # the graph output keeps its name (the writer gives it to the int8 blob)
                q.name = f"{v.name}__int8"
            out = self.new.value(v.name if output else f"{v.name}/dequantize", v.shape, np.dtype(F32))
            self.new.add_node("TnnDequantize", [q], [out], name=f"{v.name}/dequantize",
                              attrs={"scale": self.scales[v]})
            self.float[v] = out
        return self.float[v]

    def _as_int8(self, v: Value) -> Value:
        if v not in self.int8:  # a float blob read by an int8 layer: quantized with its own scale
            out = self.new.value(f"{v.name}/quantize", v.shape, I8)
            self.new.add_node("TnnQuantize", [self._as_float(v)], [out], name=f"{v.name}/quantize",
                              attrs={"scale": self.scales[v]})
            self.int8[v] = out
        return self.int8[v]

    def _out(self, node: Node, v: Value, op: str, inputs: list[Value], params: dict, attrs: dict) -> None:
        out = self.new.value(v.name, v.shape, I8)
        self.int8[v] = out
        attrs = {**attrs, "out_scale": self.scales[v]}
        self.new.add_node(op, inputs, [out], name=node.name, params=params, attrs=attrs, source=node.source)

    # -- layers ---------------------------------------------------------------------------------------------
    def _copy(self, node: Node) -> None:
        inputs = [self._as_float(v) for v in node.inputs]
        outputs = [self._float_value(v) for v in node.outputs]
        self.new.add_node(node.op_type, inputs, outputs, name=node.name, params=dict(node.params),
                          attrs=dict(node.attrs), source=node.source)

    def _TnnQConv(self, node: Node) -> None:
        p, x = node.params, node.inputs[0]
        groups = int(p.get("groups", 1) or 1)
        w, b, ws = quantize_conv(node.attrs["weight"], node.attrs.get("bias"), self.scales[x], groups,
                                 self.per_channel, self.means.get(x))
        act = self.plan.activation.get(node)
        t, left = p.get("pads", (0, 0, 0, 0))[:2]
        params = {"stride": tuple(p.get("stride", (1, 1))), "pads": (t, left, t, left),
                  "dilation": tuple(p.get("dilation", (1, 1))), "groups": groups,
                  "activation": act[0] if act else None}
        self._out(node, self.plan.output_of(node), "TnnQConv", [self._as_int8(x)], params,
                  {"weight": w, "bias": b, "weight_scale": ws})

    def _TnnQInnerProduct(self, node: Node) -> None:
        x = node.inputs[0]
        w, b, ws = quantize_inner_product(node.attrs["weight"], node.attrs.get("bias"), self.scales[x],
                                          self.per_channel)
        self._out(node, node.outputs[0], "TnnQInnerProduct", [self._as_int8(x)], {},
                  {"weight": w, "bias": b, "weight_scale": ws})

    def _TnnQAdd(self, node: Node) -> None:
        a, b = node.inputs
        out = node.outputs[0]
        attrs = {"scale_a": self.scales[a], "scale_b": self.scales[b], "scale_out": self.scales[out]}
        self._out(node, out, "TnnQAdd", [self._as_int8(a), self._as_int8(b)], {}, attrs)

    def _TnnQRelu(self, node: Node) -> None:
        self._out(node, node.outputs[0], "TnnQRelu", [self._as_int8(node.inputs[0])], {}, {})

    def _TnnQPool(self, node: Node) -> None:
        p = node.params
        t, left = p.get("pads", (0, 0, 0, 0))[:2]
        params = {"mode": "max", "kernel": tuple(p["kernel"]), "stride": tuple(p.get("stride") or p["kernel"]),
                  "pads": (t, left), "ceil_mode": bool(p.get("ceil_mode"))}
        self._out(node, node.outputs[0], "TnnQPool", [self._as_int8(node.inputs[0])], params, {})

    def _TnnQConcat(self, node: Node) -> None:
        out = node.outputs[0]
        attrs = {}
        if all(self.scales[v].size == 1 for v in [*node.inputs, out]):
            attrs = {"scales": np.concatenate([self.scales[v] for v in node.inputs]).astype(F32),
                     "scale_out": self.scales[out]}
        self._out(node, out, "TnnQConcat", [self._as_int8(v) for v in node.inputs], {"axis": 1}, attrs)


def build_int8(graph: Graph, plan: Int8Plan, scales: dict[Value, np.ndarray], per_channel_weights: bool = True,
               means: dict[Value, np.ndarray] | None = None) -> Graph:
    """The int8 graph of `graph` under `plan`, with `scales` (float32 per blob: one per channel, or one); with
    `means` (per-channel means of conv inputs) the conv biases are corrected for the weights' rounding."""
    return _Builder(graph, plan, scales, per_channel_weights, means).run()
