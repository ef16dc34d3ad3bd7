"""Activations: all inplace, same shape and dtype out. References are numpy in float64 (torch formulas), kernels are
numba loops or ufunc chains that may run with the output sharing the input's buffer."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from engine.devices.cpu.loops import pointwise as mk
from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.epilogue import apply_activation
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import empty, reference_kernel

__all__ = ["apply_activation"]

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _p(node: Node, name: str, default):
    v = node.params.get(name, default)
    return default if v is None else v


def _softplus(x: np.ndarray, beta: float = 1.0, threshold: float = 20.0) -> np.ndarray:
    bx = x * beta
    soft = (np.log1p(np.exp(-np.abs(bx))) + np.maximum(bx, 0)) / beta
    return np.where(bx > threshold, x, soft)


def _clip_bounds(node: Node) -> tuple[float, float]:
    lo, hi = node.params.get("min"), node.params.get("max")
    return (-np.inf if lo is None else float(lo)), (np.inf if hi is None else float(hi))


def _prelu_slope(node: Node, x: np.ndarray) -> np.ndarray:
    slope = np.asarray(node.attrs["slope"], dtype=np.float64).reshape(-1)
    channels = x.shape[1] if x.ndim >= 2 else (x.shape[0] if x.ndim == 1 else 1)
    if slope.size not in (1, channels):
        raise ShapeError(f"{node.where()}: PRelu slope has {slope.size} values for {channels} channels")
    return slope


def _prelu_ref(node: Node, x: np.ndarray) -> np.ndarray:
    slope = _prelu_slope(node, x)
    if slope.size > 1:
        slope = slope.reshape((-1,) + (1,) * max(x.ndim - 2, 0))
    return np.where(x > 0, x, x * slope)


# name -> numpy reference on float64 data (torch formulas).
REFERENCES: dict[str, Callable[[Node, np.ndarray], np.ndarray]] = {
    "Relu": lambda n, x: np.maximum(x, 0),
    "Clip": lambda n, x: np.clip(x, *_clip_bounds(n)),
    "LeakyRelu": lambda n, x: np.where(x > 0, x, x * _p(n, "alpha", 0.01)),
    "PRelu": _prelu_ref,
    "Sigmoid": lambda n, x: 1 / (1 + np.exp(-x)),
    "Tanh": lambda n, x: np.tanh(x),
    "Silu": lambda n, x: x / (1 + np.exp(-x)),
    "Gelu": lambda n, x: (0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))))
    if _p(n, "approximate", "none") == "tanh" else 0.5 * x * (1 + _erf(x / math.sqrt(2))),
    "HardSwish": lambda n, x: x * np.clip(_p(n, "alpha", 1 / 6) * x + _p(n, "beta", 0.5), 0, 1),
    "HardSigmoid": lambda n, x: np.clip(_p(n, "alpha", 1 / 6) * x + _p(n, "beta", 0.5), 0, 1),
    "Elu": lambda n, x: np.where(x > 0, x, _p(n, "alpha", 1.0) * np.expm1(np.minimum(x, 0))),
    "Mish": lambda n, x: x * np.tanh(_softplus(x)),
    "Softplus": lambda n, x: _softplus(x, _p(n, "beta", 1.0), _p(n, "threshold", 20.0)),
}


def _infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: {node.op_type} takes 1 input, got {len(ins)}")
    if node.op_type == "PRelu":
        if "slope" not in node.attrs:
            raise ShapeError(f"{node.where()}: PRelu needs a 'slope' attr")
        _prelu_slope(node, np.empty(ins[0].shape, np.uint8))
    return [TensorInfo(ins[0].shape, ins[0].dtype)]


def _reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    with np.errstate(over="ignore"):
        y = REFERENCES[node.op_type](node, x.astype(np.float64))
    return [np.asarray(y).astype(x.dtype)]


def _flat_loop(loop, dtype, *args):
    """Kernel from a numba loop over flat views (x may be the output buffer), compiled now for `dtype`."""
    loop(empty(1, dtype), empty(1, dtype), *args)

    def run(inputs, outputs, workspace):
        loop(np.ascontiguousarray(inputs[0]).reshape(-1), outputs[0].reshape(-1), *args)
    return run


def _ufunc(fn):
    def run(inputs, outputs, workspace):
        fn(inputs[0], outputs[0])
    return run


def _prelu_kernel(node: Node, ins: list[TensorInfo]):
    slope = np.ascontiguousarray(_prelu_slope(node, np.empty(ins[0].shape, np.uint8)), dtype=ins[0].dtype)
    if slope.size == 1:  # one shared slope is a leaky relu
        return _flat_loop(mk.leaky_relu_loop, slope.dtype, float(slope[0]))
    mk.prelu_loop(empty(3, slope.dtype), empty(3, slope.dtype), slope)

    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        view = (x.shape[0], x.shape[1], -1) if x.ndim >= 2 else (1, x.size, 1)
        mk.prelu_loop(x.reshape(view), out.reshape(view), slope)
    return run


def _kernel(node: Node, ins: list[TensorInfo]):
    op, dt = node.op_type, np.dtype(ins[0].dtype)
    if dt not in (np.float32, np.float64):
        return reference_kernel(node, _reference)  # integer activations are rare
    if op == "Relu":
        return _ufunc(lambda x, out: np.maximum(x, 0, out=out))
    if op == "Clip":
        lo, hi = _clip_bounds(node)
        return _ufunc(lambda x, out: np.clip(x, lo, hi, out=out))
    if op == "Tanh":
        return _ufunc(lambda x, out: np.tanh(x, out=out))
    if op == "PRelu":
        return _prelu_kernel(node, ins)
    if op == "Gelu":
        return _flat_loop(mk.gelu_tanh_loop if _p(node, "approximate", "none") == "tanh" else mk.gelu_loop, dt)
    loops = {
        "LeakyRelu": (mk.leaky_relu_loop, float(_p(node, "alpha", 0.01))),
        "Sigmoid": (mk.sigmoid_loop,), "Silu": (mk.silu_loop,), "Mish": (mk.mish_loop,),
        "HardSwish": (mk.hardswish_loop, float(_p(node, "alpha", 1 / 6)), float(_p(node, "beta", 0.5))),
        "HardSigmoid": (mk.hardsigmoid_loop, float(_p(node, "alpha", 1 / 6)), float(_p(node, "beta", 0.5))),
        "Elu": (mk.elu_loop, float(_p(node, "alpha", 1.0))),
        "Softplus": (mk.softplus_loop, float(_p(node, "beta", 1.0)), float(_p(node, "threshold", 20.0))),
    }
    loop, *args = loops[op]
    return _flat_loop(loop, dt, *args)


register(*[OpDef(name, _infer, _reference, _kernel, inplace=True) for name in REFERENCES])
