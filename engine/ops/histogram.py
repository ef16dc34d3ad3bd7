"""`Histogram`: counts of the bin indices in an int32 tensor (TNN's Histogram layer).

Input x int32 of any shape, every value a bin index in [0, depth); param depth > 0. Output (depth,) int32:
out[k] = the number of elements equal to k. A value outside [0, depth) is an error of the request (TNN's acc
would write outside its output).
"""

from __future__ import annotations

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register

I32 = np.dtype(np.int32)


def _depth(node: Node) -> int:
    depth = int(node.params["depth"])
    if depth <= 0:
        raise ShapeError(f"{node.where()}: Histogram depth {depth} must be positive")
    return depth


def infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if np.dtype(ins[0].dtype) != I32:
        raise ShapeError(f"{node.where()}: Histogram takes int32 bin indices, got {np.dtype(ins[0].dtype)}")
    return [TensorInfo((_depth(node),), I32)]


def counts(node: Node, x: np.ndarray) -> np.ndarray:
    depth = _depth(node)
    flat = np.asarray(x).reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= depth):
        raise ShapeError(f"{node.where()}: Histogram bin index {int(flat.min())}..{int(flat.max())} outside "
                         f"[0, {depth})")
    return np.bincount(flat, minlength=depth).astype(I32)


def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [counts(node, arrays[0])]


register(OpDef("Histogram", infer, reference, arity=(1, 1)))
