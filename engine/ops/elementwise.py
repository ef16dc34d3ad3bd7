"""Elementwise binaries, `Where` and unaries, with numpy broadcasting and torch type promotion.

Kernels are numpy ufuncs writing straight into the output view; a mixed-dtype operand is cast inside the ufunc's
buffered loop (`signature=`), so no operand-sized temporary is made.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from engine.devices.cpu.loops import rows as PL
from engine.devices.cpu.loops.pointwise import erf_loop
from engine.devices.cpu.threads import parallel_for
from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import BOOL, broadcast, empty, float_of, numba_ok, promote, reference_kernel, with_value

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
# float binaries with a row-broadcast numba kernel (see row_plan)
_ROW_OPS = {"Add": PL.ADD, "Sub": PL.SUB, "Mul": PL.MUL, "Div": PL.DIV}


def _binary_dtypes(node: Node, ins: list[TensorInfo]) -> tuple[np.ufunc, np.dtype, np.dtype]:
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
    _, _, ot = _binary_dtypes(node, ins)
    return with_value(node, ins, [TensorInfo(shape, ot)], _binary_reference)


def _infos(arrays: list[np.ndarray]) -> list[TensorInfo]:
    return [TensorInfo(tuple(a.shape), a.dtype) for a in arrays]


def _binary_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    ufunc, ct, ot = _binary_dtypes(node, _infos(arrays))
    a, b = (np.asarray(x).astype(ct, copy=False) for x in arrays)
    if node.op_type == "Pow" and ct.kind in "iu" and np.any(b < 0):
        raise ShapeError(f"{node.where()}: Pow of integers to negative powers")
    with np.errstate(all="ignore"):
        return [np.asarray(ufunc(a, b)).astype(ot, copy=False)]


def row_plan(big: tuple[int, ...], small: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(rows, s_rows, width R) when `small` broadcasts against `big` as (rows, Q*R) (op) (s_rows, R) with
    s row p % s_rows: after leading broadcast dims, a run of kept dims, a run (Q >= 4) of broadcast ones, then
    optionally kept ones. (N,C,H,W) * (N,C,1,1) is (N*C, H*W) by (N*C, 1); the blocked (N,Cb,H,W,16) *
    (N,Cb,1,1,16) is (N*Cb, H*W*16) by (N*Cb, 16); (N,C,H,W) + (C,1,1) is (N*C, H*W) by (C, 1)."""
    small = (1,) * (len(big) - len(small)) + tuple(small)
    if len(small) != len(big):
        return None
    runs: list[list] = []  # [kind, product] with kind "k" (kept) or "b" (broadcast); size-1 dims join anything
    for d, s in zip(big, small, strict=True):
        if d == 1:
            continue
        kind = "k" if s == d else "b" if s == 1 else None
        if kind is None:
            return None
        if runs and runs[-1][0] == kind:
            runs[-1][1] *= d
        else:
            runs.append([kind, d])
    kinds = "".join(k for k, _ in runs)
    lead = runs[0][1] if kinds.startswith("b") else 1
    core = kinds[1:] if kinds.startswith("b") else kinds
    if core not in ("kb", "kbk"):
        return None
    i = len(kinds) - len(core)
    p_a, q = runs[i][1], runs[i + 1][1]
    r = runs[i + 2][1] if core == "kbk" else 1
    return (lead * p_a, p_a, r) if q >= 4 else None


def _binary_kernel(node: Node, ins: list[TensorInfo]):
    ufunc, ct, ot = _binary_dtypes(node, ins)
    sig = (ct, ct, ot)
    row_op = _ROW_OPS.get(node.op_type) if ct == ot and ct in (np.float32, np.float64) else None
    plans: dict[tuple, tuple | None] = {}
    if row_op is not None:  # compile (or load from numba's cache) now, not on the first request
        PL.rows_binary(empty(2, ct), np.zeros((1, 1), ct), empty(2, ct), row_op, False, 0, 0)

    def plan(a, b, out):
        key = (a.shape, b.shape, a.dtype, b.dtype)
        if key not in plans:
            plans[key] = None
            if a.dtype == b.dtype == ct:
                swap = a.shape != out.shape
                big, small = (b, a) if swap else (a, b)
                if big.shape == out.shape:
                    rows = row_plan(out.shape, small.shape)
                    plans[key] = None if rows is None else (swap, *rows)
        return plans[key]

    def run(inputs, outputs, workspace):
        a, b = inputs
        out = outputs[0]
        p = plan(a, b, out) if row_op is not None else None
        if p is not None:
            swap, rows, s_rows, width = p
            big, small = (b, a) if swap else (a, b)
            # memory-bound: split only past ~8 MB (EfficientNet's SE products ran slower on 2 threads at b1 and b8)
            parallel_for(PL.rows_binary, rows, out.size // 8, np.ascontiguousarray(big).reshape(rows, -1),
                         np.ascontiguousarray(small).reshape(s_rows, width), out.reshape(rows, -1), row_op, swap)
            return
        with np.errstate(all="ignore"):
            ufunc(a, b, out=out, signature=sig, casting="unsafe")
    return run


# -- Where ------------------------------------------------------------------------------------------------
def _where_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 3:
        raise ShapeError(f"{node.where()}: Where takes (cond, a, b), got {len(ins)} inputs")
    shape = broadcast(node, [i.shape for i in ins])
    return with_value(node, ins, [TensorInfo(shape, promote(ins[1:]))], _where_reference)


def _where_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    ot = promote(_infos(arrays[1:]))
    c, a, b = arrays
    return [np.where(np.asarray(c).astype(bool), np.asarray(a).astype(ot), np.asarray(b).astype(ot))]


def _where_kernel(node: Node, ins: list[TensorInfo]):
    def run(inputs, outputs, workspace):
        cond, a, b = inputs
        out = outputs[0]
        np.copyto(out, b, casting="unsafe")
        np.copyto(out, a, casting="unsafe", where=cond.astype(bool, copy=False))
    return run


# -- unaries ------------------------------------------------------------------------------------------------
def _rsqrt(x, out=None):
    if out is None:
        return 1 / np.sqrt(x)
    np.sqrt(x, out=out)
    return np.reciprocal(out, out=out)


def _erf(x, out=None):
    if out is None:  # the reference: math.erf in float64
        return _erf_f64(x.astype(np.float64)).astype(x.dtype)
    erf_loop(np.ascontiguousarray(x).reshape(-1), out.reshape(-1))
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


def _unary_dtype(node: Node, dt: np.dtype) -> np.dtype:
    kind = UNARY[node.op_type][1]
    if kind == "float":
        return float_of(dt)
    return BOOL if kind == "bool" else np.dtype(dt)


def _unary_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: {node.op_type} takes 1 input, got {len(ins)}")
    out = TensorInfo(ins[0].shape, _unary_dtype(node, ins[0].dtype))
    return with_value(node, ins, [out], _unary_reference)


def _unary_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    fn, kind = UNARY[node.op_type]
    x = np.asarray(arrays[0])
    ot = _unary_dtype(node, x.dtype)
    if kind == "round" and x.dtype.kind in "iub":
        return [x.copy()]  # rounding an integer is the identity (numpy would return floats)
    with np.errstate(all="ignore"):
        return [np.asarray(fn(x.astype(ot, copy=False))).astype(ot, copy=False)]


def _unary_kernel(node: Node, ins: list[TensorInfo]):
    fn, kind = UNARY[node.op_type]
    dt = np.dtype(ins[0].dtype)
    if node.op_type == "Erf":
        if not numba_ok(dt):
            return reference_kernel(node, _unary_reference)
        erf_loop(empty(1, dt), empty(1, float_of(dt)))
    if kind == "round" and dt.kind in "iub":
        return lambda inputs, outputs, ws: np.copyto(outputs[0], inputs[0])
    if kind == "float" and dt != _unary_dtype(node, dt):
        def run_cast(inputs, outputs, workspace):
            out = outputs[0]
            np.copyto(out, inputs[0], casting="unsafe")
            with np.errstate(all="ignore"):
                fn(out, out=out)
        return run_cast

    def run(inputs, outputs, workspace):
        with np.errstate(all="ignore"):
            fn(inputs[0], out=outputs[0])
    return run


def _defs() -> list[OpDef]:
    defs = [OpDef(name, _binary_infer, _binary_reference, _binary_kernel, inplace=True) for name in BINARY]
    defs.append(OpDef("Where", _where_infer, _where_reference, _where_kernel))
    defs += [OpDef(name, _unary_infer, _unary_reference, _unary_kernel, inplace=True) for name in UNARY]
    return defs


register(*_defs())
