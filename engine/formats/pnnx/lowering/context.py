"""Ctx: one pnnx node being lowered. Parameter access, input lookup by `$` name, node emission, errors.

A handler either turns the node into a canonical op in place (`become`), or emits several canonical nodes whose
last ones take over the node's output values (`emit` + `done`), so the consumers stay linked.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from engine.errors import ModelFormatError, UnsupportedOpError
from engine.ir import Graph, Node, Value
from engine.ops.expression import ExpressionError, Lit, evaluate, parse

PREFIX = "pnnx:"


class Ctx:
    """One pnnx node being lowered: parameter access, input lookup by `$` name, node emission, errors."""

    def __init__(self, graph: Graph, node: Node):
        self.graph, self.node = graph, node
        self.type = node.op_type[len(PREFIX) :]
        self.arg_names: list[str | None] = list(node.params.get("$inputs") or [None] * len(node.inputs))
        self._emitted = 0

    # -- reading ----------------------------------------------------------------------------------------
    def p(self, name: str, default: Any = None) -> Any:
        v = self.node.params.get(name, default)
        return default if v is None else v

    def has(self, name: str) -> bool:
        return self.node.params.get(name) is not None

    def arg(self, name: str, position: int | None = None) -> Value | None:
        """The input tagged `$name`, else the one at `position` (untagged module inputs), else None."""
        for v, n in zip(self.node.inputs, self.arg_names, strict=False):
            if n == name:
                return v
        if position is not None and position < len(self.node.inputs) and self.arg_names[position] is None:
            return self.node.inputs[position]
        return None

    def x(self) -> Value:
        if not self.node.inputs:
            raise self.fail("has no input")
        return self.node.inputs[0]

    def rank(self, v: Value) -> int:
        if v.shape is None:
            raise self.unsupported(f"input {v.name!r} of unknown rank")
        return len(v.shape)

    def weight(self, name: str, required: bool = True) -> np.ndarray | None:
        """Attribute `name` as float32 (no copy when it already is)."""
        w = self.node.attrs.get(name)
        if w is None or w.size == 0:
            if required:
                raise self.fail(f"missing weight @{name}")
            return None
        return np.asarray(w, np.float32)

    def literal(self, v: Value, what: str = "") -> Any:
        """The python value of a scalar argument: a constant, or an input-less expression such as `expr=32`."""
        if v.is_const:
            return v.const.item() if v.const.size == 1 else v.const.tolist()
        node = v.producer
        if node is not None and not node.inputs and node.op_type in ("Expression", "pnnx:pnnx.Expression"):
            try:
                tree = parse(node.params["expr"])
                return tree.value if isinstance(tree, Lit) else evaluate(tree, [])
            except ExpressionError as e:
                raise self.fail(f"argument {v.name!r}: {e}") from None
        raise self.unsupported(f"a run-time {what or 'value'} (operand {v.name!r})")

    # -- errors -----------------------------------------------------------------------------------------
    def line(self) -> int | None:
        m = re.search(r":(\d+)$", self.node.source)
        return int(m.group(1)) if m else None

    def fail(self, msg: str) -> ModelFormatError:
        return ModelFormatError(self.graph.path or self.node.source, f"{self.type} {self.node.name!r}: {msg}",
                                line=self.line())

    def unsupported(self, detail: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"{self.type} with {detail}", self.node.name, self.node.where())

    # -- rewriting --------------------------------------------------------------------------------------
    def become(self, op_type: str, params: dict | None = None, attrs: dict | None = None,
               inputs: list[Value] | None = None) -> None:
        """Turns the node itself into a canonical op (outputs and position unchanged)."""
        node = self.node
        if inputs is not None:
            for v in node.inputs:
                v.consumers.remove(node)
            node.inputs = list(inputs)
            for v in node.inputs:
                v.consumers.append(node)
        node.op_type, node.params, node.attrs = op_type, dict(params or {}), dict(attrs or {})

    def emit(self, op_type: str, inputs: list[Value], params: dict | None = None, attrs: dict | None = None,
             outputs: list[Value] | int = 1) -> list[Value]:
        """Inserts a canonical node before the pnnx node; `outputs` may be the pnnx node's own values."""
        self._emitted += 1
        tag = f"{self.node.name}/{op_type}{self._emitted}"
        if isinstance(outputs, int):
            outputs = [self.graph.value(f"{tag}:{i}" if outputs > 1 else tag) for i in range(outputs)]
        index = self.graph.nodes.index(self.node)
        self.graph.add_node(op_type, inputs, outputs, name=tag, params=params, attrs=attrs,
                            source=self.node.source, index=index)
        return list(outputs)

    def const(self, data: Any, dtype: Any = None, name: str | None = None) -> Value:
        arr = np.asarray(data, dtype=dtype)
        self._emitted += 1
        return self.graph.const(arr, name or f"{self.node.name}/const{self._emitted}")

    def done(self) -> None:
        """Removes the pnnx node after its outputs were taken over by emitted nodes (or are unused)."""
        node = self.node
        for v in node.outputs:
            if v.producer is node:
                if v.consumers or v in self.graph.outputs:
                    raise self.unsupported(f"output {v.name!r} that the lowering does not produce")
                v.producer = None
        for v in node.inputs:
            while node in v.consumers:
                v.consumers.remove(node)
        self.graph.nodes.remove(node)

    def drop_outputs(self, keep: int, what: str) -> None:
        """Detaches outputs past the first `keep` (e.g. pooling indices); they must be unused."""
        extra = self.node.outputs[keep:]
        if any(v.consumers or v in self.graph.outputs for v in extra):
            raise self.unsupported(what)
        for v in extra:
            v.producer = None
        self.node.outputs = self.node.outputs[:keep]

    def bypass(self) -> None:
        """Removes an identity-like node (Dropout, Identity, contiguous), keeping graph output names."""
        node, out, src = self.node, self.node.outputs[0], self.node.inputs[0]
        if out in self.graph.outputs and (src in self.graph.inputs or src in self.graph.outputs or src.is_const):
            self.become("Identity", {})
            return
        if out in self.graph.outputs:
            src.name = out.name
        self.graph.replace_uses(out, src)
        out.producer = None
        for v in node.inputs:
            while node in v.consumers:
                v.consumers.remove(node)
        self.graph.nodes.remove(node)
