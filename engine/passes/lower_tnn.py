"""Lowers TNN layers (`tnn:Convolution`, ...) to the canonical ops of engine/ops/SPEC.md.

Each layer is replaced by one or more canonical nodes whose last node takes over the layer's output values,
so consumers stay linked. Shapes are tracked while lowering (from the file's input shapes) because a few TNN
encodings need them: v1 constant operands store only an element count, SplitV without sizes splits evenly.

Quantized layers (`Quantized*`) run TNN's int8 semantics through the ops of engine/ops/quant.py: their
output blobs are int8, a float value entering one is quantized with its blob scale, and an int8 value
entering a float layer (or leaving the graph) is dequantized, as TNN's reformat layers do.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.errors import EngineError, ModelFormatError, UnsupportedOpError
from engine.ir import Graph, Node, Value
from engine.ops.registry import TensorInfo

PREFIX = "tnn:"


class Ctx:
    """Everything one layer's lowering needs: its node, argument parsing, emitting, known shapes."""

    def __init__(self, low: _Lowering, node: Node):
        self.low, self.node, self.graph = low, node, low.graph
        self.args: list[str] = list(node.params.get("args", []))
        self.type = node.op_type[len(PREFIX):]
        self._emitted = 0

    # -- arguments ------------------------------------------------------------------------------------------
    def fail(self, message: str):
        line = self.node.source.rsplit(":", 1)[-1]
        raise ModelFormatError(self.graph.path, f"layer {self.node.name!r} ({self.type}): {message}",
                               line=int(line) if line.isdigit() else None)

    def unsupported(self, what: str = ""):
        raise UnsupportedOpError(f"tnn:{self.type}{' ' + what if what else ''}", self.node.name, self.node.where())

    def i(self, k: int, default: int | None = None) -> int:
        if k >= len(self.args):
            if default is None:
                self.fail(f"parameter {k} is missing")
            return default
        try:
            return int(self.args[k])
        except ValueError:
            try:
                return int(float(self.args[k]))
            except ValueError:
                self.fail(f"parameter {k} should be an integer, got {self.args[k]!r}")

    def f(self, k: int, default: float | None = None) -> float:
        if k >= len(self.args):
            if default is None:
                self.fail(f"parameter {k} is missing")
            return default
        try:
            return float(self.args[k])
        except ValueError:
            self.fail(f"parameter {k} should be a number, got {self.args[k]!r}")

    def counted(self, k: int) -> tuple[list[int], int]:
        """A `n v_0 .. v_{n-1}` list at position k; returns it and the position after it."""
        n = self.i(k, 0)
        if n < 0 or k + 1 + n > len(self.args):
            self.fail(f"list at parameter {k} claims {n} values")
        return [self.i(k + 1 + j) for j in range(n)], k + 1 + n

    def attr(self, key: str, required: bool = True) -> np.ndarray | None:
        a = self.node.attrs.get(key)
        if a is None and required:
            self.fail(f"resource '{key}' is missing from the .tnnmodel")
        return a

    # -- values and emitting ----------------------------------------------------------------------------------
    @property
    def inputs(self) -> list[Value]:
        return self.node.inputs

    @property
    def outputs(self) -> list[Value]:
        return self.node.outputs

    def shape(self, v: Value) -> tuple[int, ...] | None:
        info = self.low.info(v)
        return None if info is None else tuple(info.shape)

    def value_of(self, v: Value) -> np.ndarray | None:
        """Data of `v` when known before running (a constant or folded shape arithmetic)."""
        if v.is_const:
            return v.const
        info = self.low.info(v)
        return None if info is None else info.value

    def const(self, data, suffix: str = "const") -> Value:
        data = np.asarray(data)  # (np.ascontiguousarray would turn a 0-d index into a 1-d one)
        return self.graph.const(data if data.flags.c_contiguous else data.copy(), name=f"{self.node.name}/{suffix}")

    def emit(self, op: str, inputs: list[Value], params: dict | None = None, attrs: dict | None = None,
             outputs: list[Value] | int = 1) -> list[Value]:
        n = self.graph.add_node(op, inputs, outputs, name=self._name(), params=params, attrs=attrs,
                                source=self.node.source)
        self.low.track(n)
        return n.outputs

    def tmp(self, op: str, inputs: list[Value], params: dict | None = None, attrs: dict | None = None) -> Value:
        return self.emit(op, inputs, params, attrs)[0]

    def out(self, op: str, inputs: list[Value], params: dict | None = None, attrs: dict | None = None) -> None:
        """Emits the node that produces this layer's outputs."""
        self.emit(op, inputs, params, attrs, outputs=list(self.outputs))

    def alias(self, v: Value) -> None:
        """The layer's single output is just `v` (an identity)."""
        self.out("Identity", [v])

    def _name(self) -> str:
        """The layer's name for its first node, `name/2`, `name/3`, ... for the ones it also needs."""
        self._emitted += 1
        return self.node.name if self._emitted == 1 else f"{self.node.name}/{self._emitted}"


Handler = Callable[[Ctx], None]


class _Lowering:
    def __init__(self, graph: Graph, handlers: dict[str, Handler], quantized: dict[str, Handler]):
        self.graph, self.handlers, self.quantized = graph, handlers, quantized
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
        from engine.passes.infer_shapes import infer_node

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

    # -- driver ----------------------------------------------------------------------------------------------
    def run(self) -> Graph:
        old, self.graph.nodes = self.graph.nodes, []
        for node in old:
            if not node.op_type.startswith(PREFIX):  # already canonical (lowering twice is harmless)
                self.graph.nodes.append(node)
                self.track(node)
                continue
            self._lower(node)
        self._dequantize_outputs()
        self.graph.remove_dead()
        return self.graph

    def _lower(self, node: Node) -> None:
        for v in node.inputs:
            while node in v.consumers:
                v.consumers.remove(node)
        for v in node.outputs:
            v.producer = None
        ctx = Ctx(self, node)
        try:
            self._dispatch(ctx, node)
        except EngineError:
            raise
        except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError) as e:
            # parameters that parse but make no sense (a weight of the wrong size, an axis out of range)
            ctx.fail(f"inconsistent parameters or weights: {type(e).__name__}: {e}")

    def _dispatch(self, ctx: Ctx, node: Node) -> None:
        ltype = ctx.type
        if ltype in self.quantized:
            node.inputs = [self.as_int8(v, node) for v in node.inputs]
            self.quantized[ltype](ctx)
            for v in node.outputs:
                self.int8.add(v)
                v.dtype = np.dtype(np.int8)
            return
        handler = self.handlers.get(ltype)
        if handler is None:
            raise UnsupportedOpError(node.op_type, node.name, node.where())
        node.inputs = [self.as_float(v, node) for v in node.inputs]
        handler(ctx)

    def _dequantize_outputs(self) -> None:
        for k, v in enumerate(self.graph.outputs):
            if v in self.int8:
                name = v.name
                v.name = f"{name}__int8"
                deq = self.as_float(v, self.graph.nodes[-1])
                deq.name = name
                self.graph.outputs[k] = deq


def lower_tnn(graph: Graph) -> Graph:
    """Replaces every `tnn:*` node by canonical (and TNN int8) ops; raises UnsupportedOpError naming the layer."""
    from engine.passes.lower_tnn_layers import HANDLERS, QUANTIZED

    return _Lowering(graph, HANDLERS, QUANTIZED).run()
