"""Normalisations: BatchNorm (folded scale/bias, inplace), LayerNorm, GroupNorm, InstanceNorm, LpNormalize, LRN.

References use biased variance in float64."""

from __future__ import annotations

import math

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import float_of, norm_axis


def attr(node: Node, name: str) -> np.ndarray | None:
    a = node.attrs.get(name)
    return None if a is None else np.asarray(a)


def channel_shape(ndim: int) -> tuple[int, ...]:
    """Shape that broadcasts a (C,) vector over axis 1 of an ndim tensor."""
    return (-1,) + (1,) * max(ndim - 2, 0)


def _check_channels(node: Node, shape: tuple[int, ...], names: tuple[str, ...]) -> None:
    if len(shape) < 2:
        raise ShapeError(f"{node.where()}: {node.op_type} needs (N, C, ...) input, got {shape}")
    for name in names:
        a = attr(node, name)
        if a is not None and a.size != shape[1]:
            raise ShapeError(f"{node.where()}: {node.op_type} {name} has {a.size} values for {shape[1]} channels")


def _infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: {node.op_type} takes 1 input, got {len(ins)}")
    shape, op = ins[0].shape, node.op_type
    if op == "BatchNorm":
        _check_channels(node, shape, ("scale", "bias"))
    elif op in ("GroupNorm", "InstanceNorm"):
        _check_channels(node, shape, ("weight", "bias"))
        groups = groups_of(node, shape[1])
        if groups <= 0 or shape[1] % groups:
            raise ShapeError(f"{node.where()}: GroupNorm: {shape[1]} channels do not split into {groups} groups")
    elif op == "LayerNorm":
        _layernorm_rows(node, shape)
    else:
        norm_axis(node, int(node.params.get("axis", 1)), len(shape))
        if int(node.params.get("p", 2)) not in (1, 2):
            raise ShapeError(f"{node.where()}: LpNormalize p must be 1 or 2, got {node.params['p']}")
    return [TensorInfo(shape, float_of(ins[0].dtype))]


def groups_of(node: Node, channels: int) -> int:
    return channels if node.op_type == "InstanceNorm" else int(node.params["num_groups"])


def _layernorm_rows(node: Node, shape: tuple[int, ...]) -> tuple[int, int]:
    k = int(node.params.get("normalized_ndim", 1))
    if not 1 <= k <= len(shape):
        raise ShapeError(f"{node.where()}: LayerNorm normalized_ndim {k} for input of rank {len(shape)}")
    n = math.prod(shape[len(shape) - k:])
    for name in ("weight", "bias"):
        a = attr(node, name)
        if a is not None and a.size != n:
            raise ShapeError(f"{node.where()}: LayerNorm {name} has {a.size} values, normalized dims {shape[-k:]}")
    return math.prod(shape[:len(shape) - k]), n


def eps_of(node: Node) -> float:
    return float(node.params.get("eps", 1e-5))


# -- references ----------------------------------------------------------------------------------------------
def _normalize(x: np.ndarray, axes: tuple[int, ...], eps: float) -> np.ndarray:
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


def _affine(node: Node, y: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    w, b = attr(node, "weight"), attr(node, "bias")
    if w is not None:
        y = y * w.astype(np.float64).reshape(shape)
    if b is not None:
        y = y + b.astype(np.float64).reshape(shape)
    return y


def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x0 = np.asarray(arrays[0])
    x, op, ot = x0.astype(np.float64), node.op_type, float_of(x0.dtype)
    if op == "BatchNorm":
        cs = channel_shape(x.ndim)
        y = x * attr(node, "scale").astype(np.float64).reshape(cs) + attr(node, "bias").astype(np.float64).reshape(cs)
    elif op == "LayerNorm":
        k = int(node.params.get("normalized_ndim", 1))
        y = _affine(node, _normalize(x, tuple(range(x.ndim - k, x.ndim)), eps_of(node)), x.shape[x.ndim - k:])
    elif op in ("GroupNorm", "InstanceNorm"):
        g = groups_of(node, x.shape[1])
        xg = x.reshape(x.shape[0], g, -1)
        y = _affine(node, _normalize(xg, (2,), eps_of(node)).reshape(x.shape), channel_shape(x.ndim))
    else:
        y = _lp_normalize(node, x)
    return [y.astype(ot)]


def _lp_normalize(node: Node, x: np.ndarray) -> np.ndarray:
    axis = norm_axis(node, int(node.params.get("axis", 1)), x.ndim)
    p = int(node.params.get("p", 2))
    if p not in (1, 2):
        raise ShapeError(f"{node.where()}: LpNormalize p must be 1 or 2, got {p}")
    norm = np.sum(np.abs(x), axis=axis, keepdims=True) if p == 1 else np.sqrt(np.sum(x * x, axis=axis, keepdims=True))
    return x / np.maximum(norm, float(node.params.get("eps", 1e-12)))


# -- LRN (ONNX LocalResponseNormalization, across channels) ------------------------------------------------------
def lrn_window(node: Node, shape: tuple[int, ...]) -> tuple[int, int, float, float, float]:
    """(channels before c, channels after c, alpha, beta, bias): ONNX's window [c - floor((size-1)/2),
    c + ceil((size-1)/2)], clipped to the channels."""
    if len(shape) < 3:
        raise ShapeError(f"{node.where()}: LRN of a {len(shape)}-D tensor (takes N, C, spatial...)")
    size = int(node.params.get("size", 0))
    if size <= 0:
        raise ShapeError(f"{node.where()}: LRN size={size}")
    return ((size - 1) // 2, size // 2, float(node.params.get("alpha", 1e-4)), float(node.params.get("beta", 0.75)),
            float(node.params.get("bias", 1.0)))


def _lrn_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    lrn_window(node, ins[0].shape)
    return [TensorInfo(ins[0].shape, ins[0].dtype)]


def lrn_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """y[c] = x[c] / (bias + alpha / size * sum of x[i]^2 over the window of c) ** beta, in float64."""
    x0 = np.asarray(arrays[0])
    x = x0.astype(np.float64)
    before, after, alpha, beta, bias = lrn_window(node, x.shape)
    square = np.zeros_like(x)
    for c in range(x.shape[1]):
        square[:, c] = (x[:, max(0, c - before):c + after + 1] ** 2).sum(axis=1)
    size = before + after + 1
    return [(x / (bias + alpha / size * square) ** beta).astype(x0.dtype)]


register(
    OpDef("LRN", _lrn_infer, lrn_reference, arity=(1, 1), float_inputs=(0,)),
)
register(
    OpDef("BatchNorm", _infer, reference, inplace=True, arity=(1, 1), float_inputs=(0,)),
    OpDef("LayerNorm", _infer, reference, arity=(1, 1), float_inputs=(0,)),
    OpDef("GroupNorm", _infer, reference, arity=(1, 1), float_inputs=(0,)),
    OpDef("InstanceNorm", _infer, reference, arity=(1, 1), float_inputs=(0,)),
    OpDef("LpNormalize", _infer, reference, arity=(1, 1), float_inputs=(0,)),
)
