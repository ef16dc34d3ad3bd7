"""Ctx: one pnnx node being lowered. Parameter access, input lookup by `$` name, node emission, errors.

A handler either turns the node into a canonical op in place (`become`), or emits several canonical nodes whose
last ones take over the node's output values (`emit` + `done`), so the consumers stay linked.

While lower_pnnx runs, `graph.nodes` is the lowered part of the graph, which it rebuilds in one pass: a node the
handler emits is appended (so it comes before the node being lowered), the node itself is appended after its
handler unless the handler removed it, and a node removed later (`remove`) is dropped at the end. Inserting
before the node, or removing it from the list, one list scan per node, made a 20k-op model take minutes. A Ctx
made without lower_pnnx's `removed` set edits the list in place (one scan per edit).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from engine.errors import ModelFormatError, UnsupportedOpError
from engine.ir import Graph, Node, Value, drop_uses
from engine.ops.expression import ExpressionError, Lit, evaluate, parse

PREFIX = "pnnx:"
DATA_TAGS = ("input", "self", "tensor")  # the `$` names pnnx gives the operand an op works on


class Ctx:
    """One pnnx node being lowered: parameter access, input lookup by `$` name, node emission, errors."""

    def __init__(self, graph: Graph, node: Node, removed: set[int] | None = None):
        self.graph, self.node = graph, node
        self.rebuilding = removed is not None  # graph.nodes is being rebuilt by lower_pnnx, without the node
        self.removed = set() if removed is None else removed  # ids of nodes lower_pnnx drops from graph.nodes
        self.kept = True  # False once the handler removed the node itself (`done`, `bypass`)
        self.after: list[Node] = []  # an `inner` node's followers, out of the list while its handler runs
        self.type = node.op_type[len(PREFIX) :]
        self.arg_names: list[str | None] = list(node.params.get("$inputs") or [None] * len(node.inputs))
        self._emitted = 0
        self.emitted: list[Node] = []  # canonical nodes the handler inserted (`emit`)
        self.folded: list[Value] = []  # inputs the handler read as literals into params (`literal`)
        self.passed: Value | None = None  # the input an identity-like node was replaced by (`bypass`)

    # -- reading ----------------------------------------------------------------------------------------
    def p(self, name: str, default: Any = None) -> Any:
        v = self.node.params.get(name, default)
        return default if v is None else v

    def has(self, name: str) -> bool:
        return self.node.params.get(name) is not None

    def arg(self, name: str, position: int | None = None) -> Value | None:
        """The input tagged `$name`, else the one at `position` when the line tags none of its inputs (module
        ops), else None. pnnx tags every named argument of a functional op, so an untagged operand there fills
        no role and is never taken by position."""
        for v, n in zip(self.node.inputs, self.arg_names, strict=False):
            if n == name:
                return v
        if position is not None and position < len(self.node.inputs) and not any(self.arg_names):
            return self.node.inputs[position]
        return None

    def x(self) -> Value:
        """The data input: the one tagged `$input` (or `$self`, `$tensor`, pnnx's other names for it) where the
        line tags its inputs, else the first."""
        if not self.node.inputs:
            raise self.fail("has no input")
        for name in DATA_TAGS:
            v = self.arg(name)
            if v is not None:
                return v
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

    def const_array(self, v: Value, what: str) -> np.ndarray:
        """A weight given as an operand (a pnnx.Attribute), as float32, taken into the op's attrs; a run-time
        operand, or one that is not floating point, is refused."""
        if not v.is_const:
            raise self.unsupported(f"a run-time {what} (operand {v.name!r})")
        if v.const.dtype.kind != "f":
            raise self.fail(f"{what} {v.name!r} is {v.const.dtype}, not floating point")
        self.folded.append(v)
        return np.asarray(v.const, np.float32)

    def floats(self, *values: Value) -> None:
        """Refuses operands the file types as integers or bools where torch's op takes floating point only (for
        ops lowered to element-wise ops that would compute on them anyway)."""
        for v in values:
            if v.dtype is not None and np.dtype(v.dtype).kind != "f":
                raise self.fail(f"operand {v.name!r} is {np.dtype(v.dtype)}; {self.type} takes floating point")

    @staticmethod
    def is_expression_literal(v: Value) -> bool:
        """Whether v is made by an input-less expression (`expr=32`), whose value `literal` computes."""
        node = v.producer
        return node is not None and not node.inputs and node.op_type in ("Expression", "pnnx:pnnx.Expression")

    def literal(self, v: Value, what: str = "") -> Any:
        """The python value of a scalar argument: a constant, or an input-less expression such as `expr=32`."""
        self.folded.append(v)
        if v.is_const:
            return v.const.item() if v.const.size == 1 else v.const.tolist()
        node = v.producer
        if self.is_expression_literal(v):
            try:
                tree = parse(node.params["expr"])
                return tree.value if isinstance(tree, Lit) else evaluate(tree, [])
            except ExpressionError as e:
                raise self.fail(f"argument {v.name!r}: {e}") from None
        raise self.unsupported(f"a run-time {what or 'value'} (operand {v.name!r})")

    # -- checks around a handler ---------------------------------------------------------------------
    def drop_shared_parameters(self) -> None:
        """A module op (`nn.*`) whose parameter is shared with another op (tied weights: an embedding and an LM
        head) gets that parameter from pnnx twice: as its own `@attr`, and as an extra untagged operand from a
        pnnx.Attribute, listed among its data inputs. The operand is dropped when it holds exactly one of the
        op's attrs; any other constant operand stays an input, and the handler must account for it."""
        if not self.type.startswith("nn."):
            return
        attrs = [a for a in self.node.attrs.values() if a is not None and a.size]
        keep = [(v, n) for v, n in zip(self.node.inputs, self.arg_names, strict=True)
                if not (v.is_const and n is None and any(_same(a, v.const) for a in attrs))]
        if len(keep) == len(self.node.inputs):
            return
        for v in self.node.inputs:
            v.consumers.remove(self.node)
        self.node.inputs = [v for v, _ in keep]
        self.arg_names = [n for _, n in keep]
        for v in self.node.inputs:
            v.consumers.append(self.node)

    def unused_inputs(self, originals: list[Value]) -> list[Value]:
        """The node's inputs (before the handler ran) that no lowered node reads and no param took in: an operand
        the handler did not understand, which would otherwise be dropped without a word."""
        used = {id(v) for n in self.emitted for v in n.inputs} | {id(v) for v in self.folded}
        if self.kept:
            used |= {id(v) for v in self.node.inputs}
        if self.passed is not None:
            used.add(id(self.passed))
        return [v for v in originals if id(v) not in used]

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
        index = None if self.rebuilding else self.graph.nodes.index(self.node)  # None: appended, before the node
        self.emitted.append(self.graph.add_node(op_type, inputs, outputs, name=tag, params=params, attrs=attrs,
                                                source=self.node.source, index=index))
        return list(outputs)

    def inner(self, node: Node) -> Ctx:
        """A Ctx for a pnnx node this handler emitted (`emit`) and lowers at once with that type's handler (a 1-D op
        through its 2-D form); `place` it after that handler ran. While rebuilding, the node and what was emitted
        after it are taken back out of the list (they are its last few entries), so that what its handler emits
        comes before it, as lower_pnnx places a node."""
        inner = Ctx(self.graph, node, self.removed if self.rebuilding else None)
        if self.rebuilding:
            nodes = self.graph.nodes
            at = next(i for i in range(len(nodes) - 1, -1, -1) if nodes[i] is node)
            inner.after = nodes[at + 1 :]
            del nodes[at:]
        return inner

    def place(self, inner: Ctx) -> None:
        """Puts an `inner` node back after its handler ran (unless the handler removed it), then what followed it."""
        if self.rebuilding:
            if inner.kept:
                self.graph.nodes.append(inner.node)
            self.graph.nodes.extend(inner.after)

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
        drop_uses(node)
        self.kept = False
        if not self.rebuilding:
            self.graph.nodes.remove(node)

    def remove(self, node: Node) -> None:
        """Removes an already lowered node (a list Expression whose values the handler folded); its outputs must be
        unused."""
        self.graph.unlink(node)
        if self.rebuilding:
            self.removed.add(id(node))
        else:
            self.graph.nodes.remove(node)

    def drop_outputs(self, keep: int, what: str) -> None:
        """Detaches outputs past the first `keep` (e.g. pooling indices); they must be unused. (pnnx writes
        return_indices=True even when nothing reads them: that param is settled here.)"""
        self.p("return_indices")
        extra = self.node.outputs[keep:]
        if any(v.consumers or v in self.graph.outputs for v in extra):
            raise self.unsupported(what)
        for v in extra:
            v.producer = None
        self.node.outputs = self.node.outputs[:keep]

    def bypass(self) -> None:
        """Removes an identity-like node (Dropout, Identity, contiguous), keeping graph output names."""
        node, out, src = self.node, self.node.outputs[0], self.x()
        self.passed = src
        if out in self.graph.outputs and (src in self.graph.inputs or src in self.graph.outputs or src.is_const):
            self.become("Identity", {})
            return
        if out in self.graph.outputs:
            src.name = out.name
        self.graph.replace_uses(out, src)
        out.producer = None
        drop_uses(node)
        self.kept = False
        if not self.rebuilding:
            self.graph.nodes.remove(node)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a, b)
