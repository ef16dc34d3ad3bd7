"""Gemm (torch Linear: y = act(x @ weight.T + bias + z) over the last axis, with the optional residual input z of the
output's shape and the fused activation of SPEC.md's epilogue) and MatMul (numpy matmul)."""

from __future__ import annotations

import numpy as np

from engine.errors import ShapeError, UnsupportedOpError
from engine.ir import Node
from engine.ops.epilogue import EPILOGUES, apply_activation
from engine.ops.registry import OpDef, TensorInfo, register


def gemm_weight(node: Node) -> np.ndarray:
    w = node.attrs.get("weight")
    if w is None or w.ndim != 2:
        raise ShapeError(f"{node.where()}: Gemm needs a 2-D 'weight' attr (N, K), got "
                         f"{None if w is None else w.shape}")
    return w


def infer_gemm(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    shape = tuple(ins[0].shape)
    w = gemm_weight(node)
    if not shape or shape[-1] != w.shape[1]:
        raise ShapeError(f"{node.where()}: Gemm input {shape} does not end in K={w.shape[1]} (weight {w.shape})")
    b = node.attrs.get("bias")
    if b is not None and b.size != w.shape[0]:
        raise ShapeError(f"{node.where()}: Gemm bias has {b.size} values for {w.shape[0]} outputs")
    act = node.params.get("activation")
    if act is not None and act not in EPILOGUES:
        raise UnsupportedOpError(f"Gemm with fused activation {act!r}", node.name, node.where())
    out = shape[:-1] + (w.shape[0],)
    if len(ins) > 2 or (len(ins) == 2 and tuple(ins[1].shape) != out):
        raise ShapeError(f"{node.where()}: Gemm takes x and an optional residual of the output's shape {out}, got "
                         f"{[tuple(i.shape) for i in ins]}")
    return [TensorInfo(out, ins[0].dtype)]


def gemm_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = arrays[0]
    infer_gemm(node, [TensorInfo(np.shape(a), np.asarray(a).dtype) for a in arrays])
    y = x.astype(np.float64) @ gemm_weight(node).astype(np.float64).T
    if node.attrs.get("bias") is not None:
        y += node.attrs["bias"].astype(np.float64).ravel()
    if len(arrays) > 1:
        y += np.asarray(arrays[1], np.float64)
    apply_activation(node.params.get("activation"), node.params.get("activation_params"), y)
    return [y.astype(x.dtype)]


def matmul_shape(node: Node, a: tuple, b: tuple) -> tuple[int, ...]:
    """numpy matmul's result shape (1-D operands promoted then dropped, batch dims broadcast)."""
    if not a or not b:
        raise ShapeError(f"{node.where()}: MatMul operands must be at least 1-D, got {a} and {b}")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeError(f"{node.where()}: MatMul inner dims differ: {a} @ {b}")
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        raise ShapeError(f"{node.where()}: MatMul batch dims do not broadcast: {a} @ {b}") from None
    out = tuple(batch) + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def infer_matmul(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if any(i.dtype == np.bool_ for i in ins[:2]):
        raise ShapeError(f"{node.where()}: MatMul of bool (torch has no bool matmul)")
    shape = matmul_shape(node, tuple(ins[0].shape), tuple(ins[1].shape))
    return [TensorInfo(shape, np.result_type(ins[0].dtype, ins[1].dtype))]


def matmul_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    a, b = arrays[0], arrays[1]
    matmul_shape(node, a.shape, b.shape)
    dtype = np.result_type(a.dtype, b.dtype)
    if np.issubdtype(dtype, np.floating):
        return [np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(dtype)]
    return [np.matmul(a, b)]


register(
    OpDef("Gemm", infer_gemm, gemm_reference, arity=(1, 2), float_inputs=(0, 1)),  # x [, residual]
    OpDef("MatMul", infer_matmul, matmul_reference, arity=(2, 2)),
)
