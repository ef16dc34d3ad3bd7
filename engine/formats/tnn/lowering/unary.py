"""TNN one-input element-wise layers -> canonical ops: activations (ReLU, PReLU, Clip, HardSwish, GELU, Selu,
Softsign, LogSigmoid, ...), math functions (Abs, Exp, Sqrt, ...), Power, BitShift, SignedMul, and the identities
(Dropout, Identity)."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import F32, Ctx, f32
from engine.formats.tnn.lowering.registry import Handler, handles, register


@handles("PReLU")
def lower_prelu(c: Ctx) -> None:
    slope = c.attr("slope")
    if c.i(0, 0) or slope.size == 1:
        return c.out("LeakyRelu", [c.inputs[0]], {"alpha": float(slope.reshape(-1)[0])})
    c.out("PRelu", [c.inputs[0]], {}, {"slope": f32(slope.reshape(-1))})


@handles("Clip")
def lower_clip(c: Ctx) -> None:
    lo, hi = c.f(0, -np.inf), c.f(1, np.inf)
    # TNN writes unbounded sides as +-DBL_MAX
    c.out("Clip", [c.inputs[0]], {"min": None if lo < -3e38 else lo, "max": None if hi > 3e38 else hi})


@handles("HardSwish")
def lower_hardswish(c: Ctx) -> None:
    alpha, beta = c.f(0, 1 / 6), c.f(1, 0.5)
    if len(c.inputs) == 1:
        return c.out("HardSwish", [c.inputs[0]], {"alpha": alpha, "beta": beta})
    # two inputs: y = x0 * hardsigmoid(x1)
    gate = c.tmp("HardSigmoid", [c.inputs[1]], {"alpha": alpha, "beta": beta})
    c.out("Mul", [c.inputs[0], gate])


def _one_input(c: Ctx) -> None:
    if len(c.inputs) != 1:
        c.fail(f"takes one input, has {len(c.inputs)}")


@handles("Selu")
def lower_selu(c: Ctx) -> None:
    # gamma * (x > 0 ? x : alpha * (exp(x) - 1)) (cpu_selu_layer_acc.cc); onnx2tnn writes both, TNN has no defaults
    _one_input(c)
    alpha, gamma = c.f(0), c.f(1)
    e = c.tmp("Elu", [c.inputs[0]], {"alpha": alpha})
    c.out("Mul", [e, c.const(F32(gamma), "gamma")])


@handles("Softsign")
def lower_softsign(c: Ctx) -> None:
    _one_input(c)  # x / (1 + |x|)
    den = c.tmp("Add", [c.tmp("Abs", [c.inputs[0]]), c.const(F32(1.0), "one")])
    c.out("Div", [c.inputs[0], den])


@handles("LogSigmoid")
def lower_logsigmoid(c: Ctx) -> None:
    # -softplus(-x): softplus's threshold keeps it exact for large |x|, where log(sigmoid(x)) loses it
    _one_input(c)
    sp = c.tmp("Softplus", [c.tmp("Neg", [c.inputs[0]])], {"beta": 1.0, "threshold": 20.0})
    c.out("Neg", [sp])


@handles("BitShift")
def lower_bit_shift(c: Ctx) -> None:
    """Params direction (0 right, else left), bits. CpuBitShiftLayerAcc shifts int32 and uint32 data as unsigned
    ints (a logical shift: zeros come in, for negative int32 too); a shift of 32 bits or more is undefined in C."""
    _one_input(c)
    direction, bits = c.i(0, 0), c.i(1, 0)
    if not 0 <= bits < 32:
        c.unsupported(f"by {bits} bits (C leaves a shift outside 0..31 undefined)")
    info = c.low.info(c.inputs[0])
    if info is not None and np.dtype(info.dtype) not in (np.dtype(np.int32), np.dtype(np.uint32)):
        c.unsupported(f"of {np.dtype(info.dtype)} data (TNN's acc shifts int32 and uint32 only)")
    c.out("BitShift", [c.inputs[0]], {"direction": "right" if direction == 0 else "left", "bits": bits})


@handles("SignedMul")
def lower_signed_mul(c: Ctx) -> None:
    """Params alpha, beta, gamma (X86SignedMulLayerAcc): t = (sign(x - alpha) + beta) * (1 / gamma) per element,
    then every channel times channel 0 of t (channel 0 itself squared): out[:, k] = t[:, k] * t[:, 0]."""
    _one_input(c)
    alpha, beta, gamma = c.f(0), c.f(1), c.f(2)
    if gamma == 0:
        c.fail("gamma is 0")
    shape = c.shape(c.inputs[0])
    if shape is not None and len(shape) < 2:
        c.fail(f"takes an (N, C, ...) input, got {shape}")
    sign = c.tmp("Sign", [c.tmp("Sub", [c.inputs[0], c.const(F32(alpha), "alpha")])])
    t = c.tmp("Mul", [c.tmp("Add", [sign, c.const(F32(beta), "beta")]), c.const(F32(1.0) / F32(gamma), "gamma_inv")])
    t0 = c.tmp("Slice", [t], {"starts": [0], "ends": [1], "axes": [1], "steps": [1]})
    c.out("Mul", [t, t0])


def _unary(op: str, **params) -> Handler:
    return lambda c: c.out(op, [c.inputs[0]], dict(params))


def _with_floats(op: str, *names_defaults) -> Handler:
    def run(c: Ctx) -> None:
        c.out(op, [c.inputs[0]], {n: c.f(k, d) for k, (n, d) in enumerate(names_defaults)})
    return run


@handles("Power")
def lower_power(c: Ctx) -> None:
    exponent, scale, shift = c.f(0, 1.0), c.f(1, 1.0), c.f(2, 0.0)
    x = c.inputs[0]
    if scale != 1.0:
        x = c.tmp("Mul", [x, c.const(F32(scale), "scale")])
    if shift != 0.0:
        x = c.tmp("Add", [x, c.const(F32(shift), "shift")])
    c.out("Pow", [x, c.const(F32(exponent), "exponent")])


register({
    "ReLU": _unary("Relu"), "Relu": _unary("Relu"), "ReLU6": _unary("Clip", min=0.0, max=6.0),
    "Relu6": _unary("Clip", min=0.0, max=6.0), "Sigmoid": _unary("Sigmoid"), "Tanh": _unary("Tanh"),
    "Swish": _unary("Silu"), "GELU": _unary("Gelu"), "Softplus": _unary("Softplus"),
    "HardSigmoid": _with_floats("HardSigmoid", ("alpha", 0.2), ("beta", 0.5)),
    "Elu": _with_floats("Elu", ("alpha", 1.0)),
    "LeakyRelu": _with_floats("LeakyRelu", ("alpha", 0.01)),  # no param written: ONNX's default slope
    "Abs": _unary("Abs"), "Exp": _unary("Exp"), "Log": _unary("Log"), "Neg": _unary("Neg"),
    "Sqrt": _unary("Sqrt"), "Rsqrt": _unary("Rsqrt"), "Square": _unary("Square"), "Floor": _unary("Floor"),
    "Ceil": _unary("Ceil"), "Sign": _unary("Sign"), "Reciprocal": _unary("Reciprocal"), "Erf": _unary("Erf"),
    "Sin": _unary("Sin"), "Cos": _unary("Cos"), "Tan": _unary("Tan"), "Asin": _unary("Asin"),
    "Acos": _unary("Acos"), "Atan": _unary("Atan"), "Not": _unary("Not"),
    "Dropout": _unary("Identity"), "Identity": _unary("Identity"),
})
