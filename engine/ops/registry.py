"""The op registry: one `OpDef` per canonical op type, collected from the family modules.

Contract (see engine/ops/SPEC.md for every op's inputs, params and attrs):
- `infer(node, ins) -> outs`: shape/dtype inference on concrete shapes. `TensorInfo.value` carries data known
  without running the graph (constants, shape arithmetic); an op whose outputs can be computed from known
  values should fill `value` in, so the runtime never schedules it. Raise ShapeError naming `node.where()`.
- `reference(node, arrays) -> arrays`: plain numpy, returns new arrays. The oracle every kernel is tested against.
- `kernel(node, ins) -> fn(inputs, outputs, workspace)`: optional fast CPU kernel built once per instance, with
  `ins` the input infos at the instance's max shapes (for prepacking weights and picking an algorithm). It writes
  into `outputs` (preallocated, C-contiguous arena views of the actual shapes), never allocates activations.
  Without one, the runtime runs `reference` and copies the result into the output view.
- `inplace`: output 0 may take input 0's buffer when input 0 dies at this node (same shape and dtype).
- `alias`: output 0 is a reshaped view of input 0 (reshape family): it gets no storage of its own.
- `workspace(node, ins) -> bytes`: scratch the kernel needs at these (max) shapes; one shared per instance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.errors import UnsupportedOpError
from engine.ir import Node

Kernel = Callable[[Sequence[np.ndarray], Sequence[np.ndarray], np.ndarray], None]


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
    kernel: Callable[[Node, list[TensorInfo]], Kernel] | None = None
    inplace: bool = False
    alias: bool = False
    workspace: Callable[[Node, list[TensorInfo]], int] | None = None


OPS: dict[str, OpDef] = {}


def register(*defs: OpDef) -> None:
    for d in defs:
        if d.op_type in OPS:
            raise RuntimeError(f"op {d.op_type!r} registered twice")
        OPS[d.op_type] = d


def get_op(op_type: str, node: str = "", where: str = "") -> OpDef:
    """The OpDef for `op_type`; a miss raises UnsupportedOpError listing what exists."""
    _load_families()
    try:
        return OPS[op_type]
    except KeyError:
        raise UnsupportedOpError(op_type, node, where, list(OPS)) from None


def all_ops() -> dict[str, OpDef]:
    _load_families()
    return OPS


def _load_families() -> None:
    # Importing the package imports every family module, each of which calls register().
    import engine.ops  # noqa: F401
