"""What the TNN lowering knows across layers: the shape (and value, when known early) of every value it has seen,
and the int8 side of quantized models.

A few TNN encodings need shapes while lowering (v1 constant operands store only an element count, SplitV
without sizes splits evenly), so shapes are tracked from the file's input shapes as nodes are emitted.
Quantized layers (`Quantized*`) run TNN's int8 semantics through the ops of engine/ops/quant.py: their output
blobs are int8, a float value entering one is quantized with its blob scale, and an int8 value entering a
float layer (or leaving the graph) is dequantized, as TNN's reformat layers do.
"""

from __future__ import annotations

import numpy as np

from engine.errors import EngineError, ModelFormatError, UnsupportedOpError
from engine.ir import Graph, Node, Value
from engine.ops.registry import TensorInfo
from engine.passes.infer_shapes import infer_node


class LoweringState:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.infos: dict[Value, TensorInfo] = {}
        self.scales: dict[str, dict] = graph.meta.pop("tnn_blob_scales", {}) or {}
        self.int8: set[Value] = set()
        self._deq: dict[Value, Value] = {}
        self._q: dict[Value, Value] = {}
        self._blob: dict[Value, str] = {}  # inserted int8 values -> the TNN blob whose scale they use
        for v in graph.inputs:
            if v.shape is not None and v.dtype is not None and all(d >= 0 for d in v.shape):
                self.infos[v] = TensorInfo(tuple(v.shape), np.dtype(v.dtype))

    def info(self, v: Value) -> TensorInfo | None:
        if v.is_const:
            return TensorInfo(tuple(v.const.shape), v.const.dtype, v.const)
        return self.infos.get(v)

    def track(self, node: Node) -> None:
        """Infers the new node's outputs when its inputs are known; unknown stays unknown."""
        ins = [self.info(v) for v in node.inputs]
        if any(i is None for i in ins):
            return
        try:
            outs = infer_node(node, ins)
        except EngineError:
            return
        self.infos.update(zip(node.outputs, outs, strict=True))

    # -- int8 plumbing -------------------------------------------------------------------------------------------
    def blob_scale(self, v: Value, where: Node) -> np.ndarray:
        name = self._blob.get(v, v.name.removesuffix("__int8"))
        entry = self.scales.get(name)
        if entry is None or "scale" not in entry:
            raise ModelFormatError(self.graph.path, f"quantized layer {where.name!r} needs a blob scale for "
                                                    f"{name!r} ({name}_scale_data_), which the .tnnmodel lacks")
        zp = entry.get("zero_point")
        if zp is not None and np.any(zp != 0):
            raise UnsupportedOpError("tnn int8 with non-zero zero points", where.name, where.where())
        return np.ascontiguousarray(entry["scale"], dtype=np.float32).reshape(-1)

    def as_int8(self, v: Value, node: Node) -> Value:
        if v in self.int8:
            return v
        if v not in self._q:
            q = self.graph.add_node("TnnQuantize", [v], 1, name=f"{v.name}/quantize", source=node.source,
                                    attrs={"scale": self.blob_scale(v, node)})
            self.track(q)
            self._q[v] = q.outputs[0]
            self._blob[q.outputs[0]] = self._blob.get(v, v.name)
            self.int8.add(q.outputs[0])
        return self._q[v]

    def as_float(self, v: Value, node: Node) -> Value:
        if v not in self.int8:
            return v
        if v not in self._deq:
            d = self.graph.add_node("TnnDequantize", [v], 1, name=f"{v.name}/dequantize", source=node.source,
                                    attrs={"scale": self.blob_scale(v, node)})
            self.track(d)
            self._deq[v] = d.outputs[0]
            self._blob[d.outputs[0]] = self._blob.get(v, v.name)
        return self._deq[v]
