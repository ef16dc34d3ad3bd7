"""Elementwise binaries, `Where` and unaries, with numpy broadcasting and torch type promotion; BitShift (a logical
shift by a constant number of bits, ONNX's on unsigned ints, TNN's on int32 read as unsigned)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import BOOL, broadcast, float_of, promote, with_value

# name -> (ufunc, kind). kind picks the compute/output dtypes: arith (promoted), div (float), cmp (bool out),
# logic (bitwise on ints, logical otherwise).
BINARY: dict[str, tuple[np.ufunc, str]] = {
    "Add": (np.add, "arith"), "Sub": (np.subtract, "arith"), "Mul": (np.multiply, "arith"),
    "Div": (np.true_divide, "div"), "Pow": (np.power, "arith"), "Maximum": (np.maximum, "arith"),
    "Minimum": (np.minimum, "arith"), "FloorDiv": (np.floor_divide, "arith"), "Mod": (np.remainder, "arith"),
    "Fmod": (np.fmod, "arith"), "Atan2": (np.arctan2, "div"),
    "And": (np.logical_and, "logic"), "Or": (np.logical_or, "logic"), "Xor": (np.logical_xor, "logic"),
    "Equal": (np.equal, "cmp"), "Less": (np.less, "cmp"), "Greater": (np.greater, "cmp"),
    "LessEqual": (np.less_equal, "cmp"), "GreaterEqual": (np.greater_equal, "cmp"),
    "NotEqual": (np.not_equal, "cmp"),
}
_erf_f64 = np.vectorize(math.erf, otypes=[np.float64])
_BITWISE = {"And": np.bitwise_and, "Or": np.bitwise_or, "Xor": np.bitwise_xor}


def binary_dtypes(node: Node, ins: list[TensorInfo]) -> tuple[np.ufunc, np.dtype, np.dtype]:
    """(ufunc, compute dtype, output dtype) for a binary node."""
    ufunc, kind = BINARY[node.op_type]
    ct = promote(ins)
    if kind == "div":
        ct = float_of(ct)
    if kind == "logic":
        if ct.kind in "iu":
            return _BITWISE[node.op_type], ct, ct
        return ufunc, BOOL, BOOL
    return ufunc, ct, BOOL if kind == "cmp" else ct


def _binary_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 2:
        raise ShapeError(f"{node.where()}: {node.op_type} takes 2 inputs, got {len(ins)}")
    shape = broadcast(node, [i.shape for i in ins])
    _, _, ot = binary_dtypes(node, ins)
    return with_value(node, ins, [TensorInfo(shape, ot)], binary_reference)


def _infos(arrays: list[np.ndarray]) -> list[TensorInfo]:
    return [TensorInfo(tuple(a.shape), a.dtype) for a in arrays]


def binary_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    ufunc, ct, ot = binary_dtypes(node, _infos(arrays))
    a, b = (np.asarray(x).astype(ct, copy=False) for x in arrays)
    if node.op_type == "Pow" and ct.kind in "iu" and np.any(b < 0):
        raise ShapeError(f"{node.where()}: Pow of integers to negative powers")
    with np.errstate(all="ignore"):
        return [np.asarray(ufunc(a, b)).astype(ot, copy=False)]


# -- Where ------------------------------------------------------------------------------------------------
def _where_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 3:
        raise ShapeError(f"{node.where()}: Where takes (cond, a, b), got {len(ins)} inputs")
    if ins[0].dtype != BOOL:  # torch.where / masked_fill take a bool condition, never a number read as one
        raise ShapeError(f"{node.where()}: Where condition must be bool, got {np.dtype(ins[0].dtype)}")
    shape = broadcast(node, [i.shape for i in ins])
    return with_value(node, ins, [TensorInfo(shape, promote(ins[1:]))], _where_reference)


def _where_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    ot = promote(_infos(arrays[1:]))
    c, a, b = arrays
    return [np.where(np.asarray(c).astype(bool), np.asarray(a).astype(ot), np.asarray(b).astype(ot))]


# -- unaries ------------------------------------------------------------------------------------------------
def _rsqrt(x, out=None):
    if out is None:
        return 1 / np.sqrt(x)
    np.sqrt(x, out=out)
    return np.reciprocal(out, out=out)


def _erf(x, out=None):
    y = _erf_f64(x.astype(np.float64)).astype(x.dtype)  # math.erf in float64
    if out is None:
        return y
    np.copyto(out, y)
    return out


def _logical_not(x, out=None):
    return np.logical_not(x, out=out)


# name -> (function(x, out=None), kind): same keeps the dtype, float turns ints into float32, bool -> bool.
UNARY: dict[str, tuple[Callable, str]] = {
    "Abs": (np.abs, "same"), "Neg": (np.negative, "same"), "Square": (np.square, "same"),
    "Sign": (np.sign, "same"), "Floor": (np.floor, "round"), "Ceil": (np.ceil, "round"),
    "Round": (np.rint, "round"), "Trunc": (np.trunc, "round"),
    "Exp": (np.exp, "float"), "Log": (np.log, "float"), "Log10": (np.log10, "float"),
    "Log1p": (np.log1p, "float"), "Expm1": (np.expm1, "float"), "Sqrt": (np.sqrt, "float"),
    "Rsqrt": (_rsqrt, "float"), "Reciprocal": (np.reciprocal, "float"), "Sin": (np.sin, "float"),
    "Cos": (np.cos, "float"), "Tan": (np.tan, "float"), "Asin": (np.arcsin, "float"),
    "Acos": (np.arccos, "float"), "Atan": (np.arctan, "float"), "Sinh": (np.sinh, "float"),
    "Cosh": (np.cosh, "float"), "Asinh": (np.arcsinh, "float"), "Acosh": (np.arccosh, "float"),
    "Atanh": (np.arctanh, "float"), "Erf": (_erf, "float"), "Not": (_logical_not, "bool"),
}


def unary_dtype(node: Node, dt: np.dtype) -> np.dtype:
    kind = UNARY[node.op_type][1]
    if kind == "float":
        return float_of(dt)
    return BOOL if kind == "bool" else np.dtype(dt)


def _unary_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: {node.op_type} takes 1 input, got {len(ins)}")
    out = TensorInfo(ins[0].shape, unary_dtype(node, ins[0].dtype))
    return with_value(node, ins, [out], unary_reference)


def unary_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    fn, kind = UNARY[node.op_type]
    x = np.asarray(arrays[0])
    ot = unary_dtype(node, x.dtype)
    if kind == "round" and x.dtype.kind in "iub":
        return [x.copy()]  # rounding an integer is the identity (numpy would return floats)
    with np.errstate(all="ignore"):
        return [np.asarray(fn(x.astype(ot, copy=False))).astype(ot, copy=False)]


# -- BitShift ----------------------------------------------------------------------------------------------------
SHIFTABLE = (np.dtype(np.int32), np.dtype(np.uint32))


def shift_params(node: Node) -> tuple[str, int]:
    direction, bits = node.params.get("direction"), int(node.params.get("bits", -1))
    if direction not in ("left", "right") or not 0 <= bits < 32:
        raise ShapeError(f"{node.where()}: BitShift direction {direction!r} bits {bits} (left or right, 0 to 31)")
    return direction, bits


def _bit_shift_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: BitShift takes 1 input, got {len(ins)}")
    shift_params(node)
    if np.dtype(ins[0].dtype) not in SHIFTABLE:
        raise ShapeError(f"{node.where()}: BitShift shifts int32 or uint32, got {np.dtype(ins[0].dtype)}")
    return with_value(node, ins, [TensorInfo(ins[0].shape, ins[0].dtype)], bit_shift_reference)


def bit_shift_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The 32 bits as unsigned, shifted (zeros come in at either end), read back in the input's type."""
    direction, bits = shift_params(node)
    x = np.ascontiguousarray(arrays[0])
    u = x.view(np.uint32)
    out = (u << np.uint32(bits)) if direction == "left" else (u >> np.uint32(bits))
    return [out.astype(np.uint32).view(x.dtype)]


def _defs() -> list[OpDef]:
    defs = [OpDef(name, _binary_infer, binary_reference, inplace=True, arity=(2, 2), follows_extent=True)
            for name in BINARY]
    defs.append(OpDef("Where", _where_infer, _where_reference, arity=(3, 3), follows_extent=True))
    defs += [OpDef(name, _unary_infer, unary_reference, inplace=True, arity=(1, 1), follows_extent=True)
             for name in UNARY]
    defs.append(OpDef("BitShift", _bit_shift_infer, bit_shift_reference, inplace=True, arity=(1, 1)))
    return defs


register(*_defs())
