"""The op registry: one `OpDef` per canonical op type, collected from the family modules.

Contract (see engine/ops/SPEC.md for every op's inputs, params and attrs):
- `infer(node, ins) -> outs`: shape/dtype inference on concrete shapes. `TensorInfo.value` carries data known
  without running the graph (constants, shape arithmetic); an op whose outputs can be computed from known
  values should fill `value` in, so the runtime never schedules it. Raise ShapeError naming `node.where()`.
- `reference(node, arrays) -> arrays`: plain numpy, returns new arrays. The oracle every kernel is tested against,
  and what a device runs (copying into the outputs) for an op its kernel table lacks.
- `inplace`: output 0 may take input 0's buffer when input 0 dies at this node (same shape and dtype).
- `alias`: output 0 is a reshaped view of input 0 (reshape family): it gets no storage of its own.
- `extent_dims`: an op whose output size depends on its input's values (NonZero, NonMaxSuppression) names, per
  output, the dim whose size `infer` gives as an upper bound (None for an output of fixed shape). The arena
  reserves the bound; its kernel returns the outputs' actual shapes, and the runtime re-derives the shapes
  downstream from them for that call (engine/runtime/extents.py).
- `follows_extent`: the op's shape rule is a plain function of its inputs' shapes, so it may take an input whose
  size is only known at run time (an extent above); a model where any other op would take one is refused at load.
- `arity` (min, max inputs) and `float_inputs` (positions that must be floating point): checked by `check_inputs`
  before `infer` runs, so no op computes on operands it does not take (torch refuses integer data where these ops
  take floats; an op reading an integer tensor as a float one would answer wrongly).

An op says what it computes, never how a device computes it: kernels live in each device's kernel table
(engine/devices/<device>/kernels.py). A plugin adds an op with `register` and its CPU kernel with
engine.devices.cpu.register_kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from engine.errors import ShapeError, UnsupportedOpError
from engine.ir import Node


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: np.dtype
    value: np.ndarray | None = None  # set when the data is known before running (constants, shapes)

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class OpDef:
    op_type: str
    infer: Callable[[Node, list[TensorInfo]], list[TensorInfo]]
    reference: Callable[[Node, list[np.ndarray]], list[np.ndarray]]
    inplace: bool = False
    alias: bool = False
    arity: tuple[int, int] | None = None
    float_inputs: tuple[int, ...] = ()
    extent_dims: tuple[int | None, ...] = ()
    follows_extent: bool = False


def check_inputs(op: OpDef, node: Node, ins: list[TensorInfo]) -> None:
    """ShapeError naming the node when it has an input count outside `op.arity` or a non-float input where the
    op takes floating point."""
    if op.arity is not None and not op.arity[0] <= len(ins) <= op.arity[1]:
        lo, hi = op.arity
        want = str(lo) if lo == hi else f"{lo} to {hi}"
        raise ShapeError(f"{node.where()}: {node.op_type} node {node.name!r} takes {want} inputs, got {len(ins)}")
    for i in op.float_inputs:
        if i < len(ins) and np.dtype(ins[i].dtype).kind != "f":
            raise ShapeError(f"{node.where()}: {node.op_type} node {node.name!r} takes floating-point input {i}, "
                             f"got {np.dtype(ins[i].dtype)}")


OPS: dict[str, OpDef] = {}


def register(*defs: OpDef, replace: bool = False) -> None:
    """Adds ops to the shared registry; an op type registered twice is an error unless `replace` is set (a
    plugin that wraps an existing op)."""
    for d in defs:
        if d.op_type in OPS and not replace:
            raise RuntimeError(f"op {d.op_type!r} registered twice")
        OPS[d.op_type] = d


def get_op(op_type: str, node: str = "", where: str = "", ops: Mapping[str, OpDef] | None = None) -> OpDef:
    """The OpDef for `op_type` in `ops` (default: the shared registry); a miss raises UnsupportedOpError listing
    what exists."""
    table = OPS if ops is None else ops
    try:
        return table[op_type]
    except KeyError:
        raise UnsupportedOpError(op_type, node, where, list(table)) from None


def all_ops() -> dict[str, OpDef]:
    return OPS
