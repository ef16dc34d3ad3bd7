"""Gemm (torch Linear: y = x @ weight.T + bias over the last axis, fused activation) and MatMul (numpy matmul)."""

from __future__ import annotations

import numpy as np

from engine.devices.cpu.blas import matmul
from engine.devices.cpu.conv import loops as K
from engine.devices.cpu.threads import parallel_for
from engine.errors import ShapeError, UnsupportedOpError
from engine.ir import Node
from engine.ops.epilogue import EPILOGUES, apply_activation
from engine.ops.registry import Kernel, OpDef, TensorInfo, register
from engine.ops.spatial import packed


def _weight(node: Node) -> np.ndarray:
    w = node.attrs.get("weight")
    if w is None or w.ndim != 2:
        raise ShapeError(f"{node.where()}: Gemm needs a 2-D 'weight' attr (N, K), got "
                         f"{None if w is None else w.shape}")
    return w


def infer_gemm(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    shape = tuple(ins[0].shape)
    w = _weight(node)
    if not shape or shape[-1] != w.shape[1]:
        raise ShapeError(f"{node.where()}: Gemm input {shape} does not end in K={w.shape[1]} (weight {w.shape})")
    b = node.attrs.get("bias")
    if b is not None and b.size != w.shape[0]:
        raise ShapeError(f"{node.where()}: Gemm bias has {b.size} values for {w.shape[0]} outputs")
    act = node.params.get("activation")
    if act is not None and act not in EPILOGUES:
        raise UnsupportedOpError(f"Gemm with fused activation {act!r}", node.name, node.where())
    return [TensorInfo(shape[:-1] + (w.shape[0],), ins[0].dtype)]


def gemm_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = arrays[0]
    infer_gemm(node, [TensorInfo(x.shape, x.dtype)])
    y = x.astype(np.float64) @ _weight(node).astype(np.float64).T
    if node.attrs.get("bias") is not None:
        y += node.attrs["bias"].astype(np.float64).ravel()
    apply_activation(node.params.get("activation"), node.params.get("activation_params"), y)
    return [y.astype(x.dtype)]


def build_gemm(node: Node, ins: list[TensorInfo]) -> Kernel:
    w = _weight(node)
    dtype = np.dtype(ins[0].dtype)
    wt = packed(w.T, dtype)  # (K, N): x @ wt reads both operands row-major
    bias = node.attrs.get("bias")
    has_bias = bias is not None
    bias = packed(np.ravel(bias), dtype) if has_bias else np.zeros(1, dtype)
    act, params = node.params.get("activation"), node.params.get("activation_params")
    code = K.act_code(act, params)
    c, *p = code or (K.ACT_NONE, 0.0, 0.0, 0.0)
    p = [dtype.type(v) for v in p]
    k, n = wt.shape

    def run(inputs, outputs, workspace):
        x = np.ascontiguousarray(inputs[0])
        out = outputs[0].reshape(-1, n)
        matmul(x.reshape(-1, k), wt, out)
        if has_bias or c:
            parallel_for(K.epilogue_cols, out.shape[0], out.size, out, bias, has_bias, c, *p)
        if code is None:
            apply_activation(act, params, out)
    return run


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
    shape = matmul_shape(node, tuple(ins[0].shape), tuple(ins[1].shape))
    return [TensorInfo(shape, np.result_type(ins[0].dtype, ins[1].dtype))]


def matmul_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    a, b = arrays[0], arrays[1]
    matmul_shape(node, a.shape, b.shape)
    dtype = np.result_type(a.dtype, b.dtype)
    if np.issubdtype(dtype, np.floating):
        return [np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(dtype)]
    return [np.matmul(a, b)]


def build_matmul(node: Node, ins: list[TensorInfo]) -> Kernel:
    # A constant operand (a weight) is packed once: file-backed data may be unaligned, which costs a copy per call.
    consts = [None if i.value is None or i.dtype.kind != "f" else packed(i.value, i.dtype) for i in ins[:2]]

    def run(inputs, outputs, workspace):
        a, b = (c if c is not None else x for c, x in zip(consts, inputs, strict=False))
        matmul(a, b, outputs[0])
    return run


register(
    OpDef("Gemm", infer_gemm, gemm_reference, kernel=build_gemm),
    OpDef("MatMul", infer_matmul, matmul_reference, kernel=build_matmul),
)
