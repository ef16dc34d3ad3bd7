"""Activations: all inplace, same shape and dtype out. References are numpy in float64 (torch formulas)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register

_erf = np.vectorize(math.erf, otypes=[np.float64])


def param(node: Node, name: str, default):
    v = node.params.get(name, default)
    return default if v is None else v


def _softplus(x: np.ndarray, beta: float = 1.0, threshold: float = 20.0) -> np.ndarray:
    bx = x * beta
    soft = (np.log1p(np.exp(-np.abs(bx))) + np.maximum(bx, 0)) / beta
    return np.where(bx > threshold, x, soft)


def clip_bounds(node: Node) -> tuple[float, float]:
    lo, hi = node.params.get("min"), node.params.get("max")
    return (-np.inf if lo is None else float(lo)), (np.inf if hi is None else float(hi))


def prelu_slope(node: Node, x: np.ndarray) -> np.ndarray:
    slope = np.asarray(node.attrs["slope"], dtype=np.float64).reshape(-1)
    channels = x.shape[1] if x.ndim >= 2 else (x.shape[0] if x.ndim == 1 else 1)
    if slope.size not in (1, channels):
        raise ShapeError(f"{node.where()}: PRelu slope has {slope.size} values for {channels} channels")
    return slope


def _prelu_ref(node: Node, x: np.ndarray) -> np.ndarray:
    slope = prelu_slope(node, x)
    if slope.size > 1:
        slope = slope.reshape((-1,) + (1,) * max(x.ndim - 2, 0))
    return np.where(x > 0, x, x * slope)


# name -> numpy reference on float64 data (torch formulas).
REFERENCES: dict[str, Callable[[Node, np.ndarray], np.ndarray]] = {
    "Relu": lambda n, x: np.maximum(x, 0),
    "Clip": lambda n, x: np.clip(x, *clip_bounds(n)),
    "LeakyRelu": lambda n, x: np.where(x > 0, x, x * param(n, "alpha", 0.01)),
    "PRelu": _prelu_ref,
    "Sigmoid": lambda n, x: 1 / (1 + np.exp(-x)),
    "Tanh": lambda n, x: np.tanh(x),
    "Silu": lambda n, x: x / (1 + np.exp(-x)),
    "Gelu": lambda n, x: (0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))))
    if param(n, "approximate", "none") == "tanh" else 0.5 * x * (1 + _erf(x / math.sqrt(2))),
    "HardSwish": lambda n, x: x * np.clip(param(n, "alpha", 1 / 6) * x + param(n, "beta", 0.5), 0, 1),
    "HardSigmoid": lambda n, x: np.clip(param(n, "alpha", 1 / 6) * x + param(n, "beta", 0.5), 0, 1),
    "Elu": lambda n, x: np.where(x > 0, x, param(n, "alpha", 1.0) * np.expm1(np.minimum(x, 0))),
    "Mish": lambda n, x: x * np.tanh(_softplus(x)),
    "Softplus": lambda n, x: _softplus(x, param(n, "beta", 1.0), param(n, "threshold", 20.0)),
}


def _infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: {node.op_type} takes 1 input, got {len(ins)}")
    if ins[0].dtype == np.bool_ or (node.op_type == "Clip" and np.dtype(ins[0].dtype).kind in "iu"
                                    and not all(float(b).is_integer() for b in clip_bounds(node) if np.isfinite(b))):
        # torch: no relu / clamp of bools; an integer tensor clamped to fractional bounds becomes float
        raise ShapeError(f"{node.where()}: {node.op_type} of {np.dtype(ins[0].dtype)} with bounds "
                         f"{clip_bounds(node)}")
    if node.op_type == "PRelu":
        if "slope" not in node.attrs:
            raise ShapeError(f"{node.where()}: PRelu needs a 'slope' attr")
        # a view of the input's shape that holds no memory: the shape comes from the file and may be huge
        prelu_slope(node, np.broadcast_to(np.uint8(0), ins[0].shape))
    return [TensorInfo(ins[0].shape, ins[0].dtype)]


def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    with np.errstate(over="ignore"):
        y = REFERENCES[node.op_type](node, x.astype(np.float64))
    return [np.asarray(y).astype(x.dtype)]


# Relu and Clip take integers too (torch.relu / clamp keep them integers); the others are floating point only.
INTEGER_OK = {"Relu", "Clip"}
register(*[OpDef(name, _infer, reference, inplace=True, arity=(1, 1), follows_extent=True,
                 float_inputs=() if name in INTEGER_OK else (0,)) for name in REFERENCES])
