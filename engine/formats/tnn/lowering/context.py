"""Ctx: one TNN layer being lowered. Its positional parameters and resources, the shapes known so far, and the
emitting of the canonical nodes whose last one takes over the layer's outputs (so consumers stay linked)."""

from __future__ import annotations

import numpy as np

from engine.errors import ModelFormatError, UnsupportedOpError
from engine.formats.tnn.lowering.state import LoweringState
from engine.ir import Node, Value

PREFIX = "tnn:"
F32 = np.float32


class Ctx:
    """Everything one layer's lowering needs: its node, argument parsing, emitting, known shapes."""

    def __init__(self, low: LoweringState, node: Node):
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

    def weight(self, key: str) -> np.ndarray:
        """A float layer's weight resource. An int8 one is refused: only TNN's Quantized* and
        DynamicRangeQuantized* layers give int8 weights a meaning (their handlers dequantize before coming here)."""
        a = self.attr(key)
        if a.dtype == np.int8:
            self.unsupported(f"with an int8 {key} (only Quantized* / DynamicRangeQuantized* layers carry int8 "
                             "weights with their scales)")
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


def f32(a: np.ndarray) -> np.ndarray:
    """A resource array as the contiguous float32 array canonical op attrs hold."""
    return np.ascontiguousarray(a, dtype=F32)
