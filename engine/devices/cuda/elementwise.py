"""Elementwise CUDA kernels: a table of unary device functions, a table of binary ones, one broadcast kernel
per entry (built from the table by a factory, so each op is one small line), Where, PRelu and BatchNorm.

Each unary function takes (x, p0, p1): p0/p1 carry the op's scalar params (alpha, beta, min, max).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from engine.devices.cuda._launch import at_least_1d, broadcast_strides, by_shapes, flat, grid
from engine.ir import Node
from engine.ops.registry import TensorInfo


def _dev(fn):
    return cuda.jit(device=True)(fn)


@_dev
def nan_max(a, b):
    """max(a, b) that returns a NaN from either side, as torch does. numba lowers a float max/min on the device to
    libdevice's fmaxf/fminf, which return the other operand: ReLU(NaN) would be 0, a plausible number."""
    if a != a:
        return a
    return b if b > a or b != b else a


@_dev
def nan_min(a, b):
    """min(a, b) keeping a NaN from either side (see nan_max)."""
    if a != a:
        return a
    return b if b < a or b != b else a


@_dev
def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


@_dev
def _softplus(x, beta, threshold):
    bx = x * beta
    if bx > threshold:
        return x
    return (math.log1p(math.exp(-abs(bx))) + max(bx, 0.0)) / beta


@_dev
def _round_even(x):
    r = math.floor(x + 0.5)
    if r - x == 0.5 and r % 2.0 != 0.0:
        r -= 1.0
    return r


@_dev
def _gelu(x):
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


@_dev
def _gelu_tanh(x):
    return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


@_dev
def _elu(x, alpha):
    return x if x > 0 else alpha * math.expm1(x)


@_dev
def _hardsigmoid(x, alpha, beta):
    return nan_min(nan_max(alpha * x + beta, 0.0), 1.0)


# op -> (device fn(x, p0, p1), params -> (p0, p1))
UNARY = {
    "Abs": (lambda x, a, b: abs(x), None), "Neg": (lambda x, a, b: -x, None),
    "Exp": (lambda x, a, b: math.exp(x), None), "Log": (lambda x, a, b: math.log(x), None),
    "Log10": (lambda x, a, b: math.log10(x), None), "Log1p": (lambda x, a, b: math.log1p(x), None),
    "Expm1": (lambda x, a, b: math.expm1(x), None), "Sqrt": (lambda x, a, b: math.sqrt(x), None),
    "Rsqrt": (lambda x, a, b: 1.0 / math.sqrt(x), None), "Reciprocal": (lambda x, a, b: 1.0 / x, None),
    "Square": (lambda x, a, b: x * x, None), "Floor": (lambda x, a, b: math.floor(x), None),
    "Ceil": (lambda x, a, b: math.ceil(x), None), "Round": (lambda x, a, b: _round_even(x), None),
    "Trunc": (lambda x, a, b: math.floor(x) if x >= 0 else math.ceil(x), None),
    "Sign": (lambda x, a, b: 1 if x > 0 else (-1 if x < 0 else x * 0), None),
    "Sin": (lambda x, a, b: math.sin(x), None), "Cos": (lambda x, a, b: math.cos(x), None),
    "Tan": (lambda x, a, b: math.tan(x), None), "Asin": (lambda x, a, b: math.asin(x), None),
    "Acos": (lambda x, a, b: math.acos(x), None), "Atan": (lambda x, a, b: math.atan(x), None),
    "Sinh": (lambda x, a, b: math.sinh(x), None), "Cosh": (lambda x, a, b: math.cosh(x), None),
    "Asinh": (lambda x, a, b: math.asinh(x), None), "Acosh": (lambda x, a, b: math.acosh(x), None),
    "Atanh": (lambda x, a, b: math.atanh(x), None), "Erf": (lambda x, a, b: math.erf(x), None),
    "Not": (lambda x, a, b: not x, None),
    "Relu": (lambda x, a, b: nan_max(x, 0), None),
    "Clip": (lambda x, a, b: nan_min(nan_max(x, a), b), lambda p: (_f(p, "min", -math.inf), _f(p, "max", math.inf))),
    "LeakyRelu": (lambda x, a, b: x if x > 0 else x * a, lambda p: (_f(p, "alpha", 0.01), 0.0)),
    "Sigmoid": (lambda x, a, b: _sigmoid(x), None), "Tanh": (lambda x, a, b: math.tanh(x), None),
    "Silu": (lambda x, a, b: x * _sigmoid(x), None),
    "HardSwish": (lambda x, a, b: x * _hardsigmoid(x, a, b), lambda p: (_f(p, "alpha", 1 / 6), _f(p, "beta", 0.5))),
    "HardSigmoid": (lambda x, a, b: _hardsigmoid(x, a, b), lambda p: (_f(p, "alpha", 1 / 6), _f(p, "beta", 0.5))),
    "Elu": (lambda x, a, b: _elu(x, a), lambda p: (_f(p, "alpha", 1.0), 0.0)),
    "Mish": (lambda x, a, b: x * math.tanh(_softplus(x, 1.0, 20.0)), None),
    "Softplus": (lambda x, a, b: _softplus(x, a, b), lambda p: (_f(p, "beta", 1.0), _f(p, "threshold", 20.0))),
    "Gelu": (lambda x, a, b: _gelu_tanh(x) if a > 0 else _gelu(x),
             lambda p: (1.0 if p.get("approximate", "none") == "tanh" else 0.0, 0.0)),
}


@_dev
def _py_mod(a, b):
    r = math.fmod(a, b)
    if r != 0 and ((r < 0) != (b < 0)):
        r += b
    return r


BINARY = {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
    "Div": lambda a, b: a / b, "Pow": lambda a, b: a ** b, "Maximum": lambda a, b: nan_max(a, b),
    "Minimum": lambda a, b: nan_min(a, b), "FloorDiv": lambda a, b: a // b, "Mod": lambda a, b: _py_mod(a, b),
    "Fmod": lambda a, b: math.fmod(a, b), "Atan2": lambda a, b: math.atan2(a, b),
    "And": lambda a, b: a & b, "Or": lambda a, b: a | b, "Xor": lambda a, b: a ^ b,
    "Equal": lambda a, b: a == b, "NotEqual": lambda a, b: a != b, "Less": lambda a, b: a < b,
    "Greater": lambda a, b: a > b, "LessEqual": lambda a, b: a <= b, "GreaterEqual": lambda a, b: a >= b,
}


def _f(p: dict, key: str, default: float) -> float:
    v = p.get(key)
    return default if v is None else float(v)


def _unary_kernel(fn):
    f = _dev(fn)

    @cuda.jit
    def k(x, y, p0, p1):
        start, step = cuda.grid(1), cuda.gridsize(1)
        for i in range(start, y.size, step):
            y[i] = f(x[i], p0, p1)

    return k


def _binary_kernel(fn):
    f = _dev(fn)

    @cuda.jit
    def k(a, b, y, shape, sa, sb):
        start, step = cuda.grid(1), cuda.gridsize(1)
        for i in range(start, y.size, step):
            rem, ia, ib = i, 0, 0
            for d in range(len(shape) - 1, -1, -1):
                idx = rem % shape[d]
                rem //= shape[d]
                ia += idx * sa[d]
                ib += idx * sb[d]
            y[i] = f(a[ia], b[ib])

    return k


@cuda.jit
def _where_kernel(c, a, b, y, shape, sc, sa, sb):
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, y.size, step):
        rem, ic, ia, ib = i, 0, 0, 0
        for d in range(len(shape) - 1, -1, -1):
            idx = rem % shape[d]
            rem //= shape[d]
            ic += idx * sc[d]
            ia += idx * sa[d]
            ib += idx * sb[d]
        y[i] = a[ia] if c[ic] else b[ib]


@cuda.jit
def _channel_affine(x, scale, bias, y, channels, inner, has_bias):
    """y = x * scale[c] (+ bias[c]); scale of one value applies to every channel (PRelu uses it as a slope)."""
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, y.size, step):
        c = (i // inner) % channels if scale.size > 1 else 0
        if has_bias:
            y[i] = x[i] * scale[c] + bias[c]
        else:
            y[i] = x[i] if x[i] > 0 else x[i] * scale[c]


_UNARY_KERNELS: dict[str, object] = {}
_BINARY_KERNELS: dict[str, object] = {}


def build_unary(dev, node: Node, ins: list[TensorInfo]):
    k = _UNARY_KERNELS.get(node.op_type)
    if k is None:
        k = _UNARY_KERNELS[node.op_type] = _unary_kernel(UNARY[node.op_type][0])
    params = UNARY[node.op_type][1]
    p0, p1 = params(node.params) if params else (0.0, 0.0)
    stream = dev.stream

    def run(inputs, outputs, workspace):
        y = flat(outputs[0])
        k[grid(y.size) + (stream,)](flat(inputs[0]), y, p0, p1)

    return run


def _broadcast_plan(ins, outs):
    shape = tuple(outs[0].shape)
    return at_least_1d(shape, *(broadcast_strides(np.shape(a), shape) for a in ins))


def build_binary(dev, node: Node, ins: list[TensorInfo]):
    k = _BINARY_KERNELS.get(node.op_type)
    if k is None:
        k = _BINARY_KERNELS[node.op_type] = _binary_kernel(BINARY[node.op_type])
    plan, stream = by_shapes(_broadcast_plan), dev.stream

    def run(inputs, outputs, workspace):
        shape, sa, sb = plan(inputs, outputs)
        y = flat(outputs[0])
        k[grid(y.size) + (stream,)](flat(inputs[0]), flat(inputs[1]), y, shape, sa, sb)

    return run


def build_where(dev, node: Node, ins: list[TensorInfo]):
    plan, stream = by_shapes(_broadcast_plan), dev.stream

    def run(inputs, outputs, workspace):
        shape, sc, sa, sb = plan(inputs, outputs)
        y = flat(outputs[0])
        _where_kernel[grid(y.size) + (stream,)](*(flat(a) for a in inputs), y, shape, sc, sa, sb)

    return run


def _channel_op(dev, scale: np.ndarray, bias: np.ndarray | None):
    d_scale = dev.upload(np.ascontiguousarray(scale, np.float32).reshape(-1))
    d_bias = dev.upload(np.ascontiguousarray(bias, np.float32).reshape(-1)) if bias is not None else d_scale
    has_bias, stream = bias is not None, dev.stream

    def run(inputs, outputs, workspace):
        shape = outputs[0].shape
        channels = shape[1] if len(shape) >= 2 else (shape[0] if shape else 1)
        inner = int(np.prod(shape[2:], dtype=np.int64)) if len(shape) >= 2 else 1
        y = flat(outputs[0])
        _channel_affine[grid(y.size) + (stream,)](flat(inputs[0]), d_scale, d_bias, y, channels, inner, has_bias)

    return run


def build_batchnorm(dev, node: Node, ins: list[TensorInfo]):
    return _channel_op(dev, node.attrs["scale"], node.attrs["bias"])


def build_prelu(dev, node: Node, ins: list[TensorInfo]):
    return _channel_op(dev, node.attrs["slope"], None)


KERNELS = {**dict.fromkeys(UNARY, build_unary), **dict.fromkeys(BINARY, build_binary),
           "Where": build_where, "BatchNorm": build_batchnorm, "PRelu": build_prelu}
