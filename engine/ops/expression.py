"""pnnx's expression mini-language: tokenizer, recursive-descent parser, evaluator, and the `Expression` op.

Grammar (../shared/docs/pnnx-format.md §6; no spaces):
    expr := IDENT '(' expr (',' expr)* ')' | '[' (expr (',' expr)*)? ']' | '@' INT | literal
Evaluation follows torch: true division, floor_divide, python-style remainder, integer tensors promoted to
float32 (never float64) when mixed with floats, and `size(t, d)` shape queries. At infer time tensors whose data
is unknown are `_Abstract(shape, dtype)`: shape arithmetic such as `[size(@0,2),size(@0,3)]` still yields a value,
and elementwise calls yield the broadcast shape with the dtype numpy/torch would produce.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from engine.errors import EngineError, ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register


class ExpressionError(EngineError):
    """A malformed expression string, or one that cannot be evaluated on the given operands."""


# -- AST -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Input:
    index: int


@dataclass(frozen=True)
class Lit:
    value: Any


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple


@dataclass(frozen=True)
class ListExpr:
    items: tuple


Expr = Input | Lit | Call | ListExpr
_DELIMS = "(),[]"
_MAX_DEPTH = 200


def tokenize(text: str) -> list[str]:
    """`add(@0,mul(@1,2.0))` -> ['add', '(', '@0', ',', 'mul', '(', ...]. Delimiters: ( ) , [ ]."""
    tokens: list[str] = []
    atom = ""
    for ch in text:
        if ch in _DELIMS or ch.isspace():
            if atom:
                tokens.append(atom)
                atom = ""
            if not ch.isspace():
                tokens.append(ch)
        else:
            atom += ch
    if atom:
        tokens.append(atom)
    return tokens


@lru_cache(maxsize=1024)
def parse(text: str) -> Expr:
    """Parses an expression string; raises ExpressionError naming the problem and the token position."""
    tokens = tokenize(text)
    if not tokens:
        raise ExpressionError(f"empty expression {text!r}")
    parser = _Parser(text, tokens)
    tree = parser.expr(0)
    if parser.pos != len(tokens):
        raise parser.error("unexpected trailing input")
    return tree


class _Parser:
    def __init__(self, text: str, tokens: list[str]):
        self.text, self.tokens, self.pos = text, tokens, 0

    def error(self, msg: str) -> ExpressionError:
        tok = self.tokens[self.pos] if self.pos < len(self.tokens) else "end of input"
        return ExpressionError(f"bad expression {self.text!r}: {msg} at token {self.pos} ({tok!r})")

    def next(self) -> str:
        if self.pos >= len(self.tokens):
            raise self.error("unexpected end")
        self.pos += 1
        return self.tokens[self.pos - 1]

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def expr(self, depth: int) -> Expr:
        if depth > _MAX_DEPTH:
            raise self.error("nested too deeply")
        tok = self.next()
        if tok == "[":
            return ListExpr(tuple(self._sequence("]", depth, allow_empty=True)))
        if tok in _DELIMS:
            self.pos -= 1
            raise self.error("expected an operand")
        if self.peek() == "(":
            if tok not in FUNCTIONS:
                raise self.error(f"unknown function {tok!r}")
            self.next()
            return Call(tok, tuple(self._sequence(")", depth, allow_empty=False)))
        return _atom(tok, self)

    def _sequence(self, close: str, depth: int, *, allow_empty: bool) -> list[Expr]:
        items: list[Expr] = []
        if allow_empty and self.peek() == close:
            self.next()
            return items
        while True:
            items.append(self.expr(depth + 1))
            tok = self.next()
            if tok == close:
                return items
            if tok != ",":
                self.pos -= 1
                raise self.error(f"expected ',' or {close!r}")


def _atom(tok: str, parser: _Parser) -> Expr:
    if tok.startswith("@"):
        if not (tok[1:].isdigit() and tok[1:].isascii()):
            raise parser.error(f"bad operand reference {tok!r}")
        return Input(int(tok[1:]))
    words = {"True": True, "False": False, "None": None}
    if tok in words:
        return Lit(words[tok])
    if tok[0].isdigit() or (tok[0] in "-+." and len(tok) > 1):
        try:
            if tok.endswith("j"):
                return Lit(complex(tok))
            return Lit(float(tok) if any(c in tok for c in ".eE") or "inf" in tok or "nan" in tok else int(tok))
        except ValueError:
            raise parser.error(f"malformed number {tok!r}") from None
    return Lit(tok)  # a bare word such as a dtype name


def inputs_used(tree: Expr) -> set[int]:
    """The operand indices `@k` an expression reads."""
    if isinstance(tree, Input):
        return {tree.index}
    if isinstance(tree, Call):
        return set().union(*(inputs_used(a) for a in tree.args))
    if isinstance(tree, ListExpr):
        return set().union(*(inputs_used(a) for a in tree.items)) if tree.items else set()
    return set()


# -- evaluation ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Abstract:
    """A tensor (or scalar) whose data is unknown: only shape and dtype."""

    shape: tuple[int, ...]
    dtype: np.dtype


def _is_int_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) and (x.dtype.kind in "iub")


def _promote(a: Any, b: Any) -> tuple[Any, Any]:
    """torch promotion where numpy differs: an integer tensor meeting a float becomes float32, not float64."""
    def fix(x: Any, other: Any) -> Any:
        if not _is_int_array(x):
            return x
        if isinstance(other, float):
            return x.astype(np.float32)
        if isinstance(other, np.ndarray) and other.dtype.kind == "f":
            return x.astype(other.dtype)
        return x
    return fix(a, b), fix(b, a)


def _truediv(a: Any, b: Any) -> Any:
    # torch: int tensor / int is a float32 tensor (numpy would say float64)
    if _is_int_array(a) or _is_int_array(b):
        a = a.astype(np.float32) if _is_int_array(a) else a
        b = b.astype(np.float32) if _is_int_array(b) else b
    return a / b


def _scalar_or_array(fn_np: Callable, fn_py: Callable | None = None) -> Callable:
    def call(a: Any, b: Any) -> Any:
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return fn_np(a, b)
        return (fn_py or (lambda x, y: fn_np(x, y).item()))(a, b)
    return call


BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": _truediv,
    "floor_divide": operator.floordiv, "remainder": operator.mod,
    "and": operator.and_, "or": operator.or_, "xor": operator.xor,
    "lshift": operator.lshift, "rshift": operator.rshift,
    "pow": operator.pow,
    "atan2": _scalar_or_array(np.arctan2, math.atan2), "fmod": _scalar_or_array(np.fmod, math.fmod),
    "max": _scalar_or_array(np.maximum, max), "min": _scalar_or_array(np.minimum, min),
    "maximum": _scalar_or_array(np.maximum, max), "minimum": _scalar_or_array(np.minimum, min),
    "logaddexp": _scalar_or_array(np.logaddexp),
}


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)


UNARY: dict[str, Callable[[Any], Any]] = {
    "abs": np.abs, "acos": np.arccos, "acosh": np.arccosh, "asin": np.arcsin, "asinh": np.arcsinh,
    "atan": np.arctan, "atanh": np.arctanh, "ceil": np.ceil, "cos": np.cos, "cosh": np.cosh, "erf": _erf,
    "exp": np.exp, "expm1": np.expm1, "floor": np.floor, "log": np.log, "log10": np.log10, "log1p": np.log1p,
    "neg": np.negative, "reciprocal": np.reciprocal, "round": np.round,
    "rsqrt": lambda x: np.reciprocal(np.sqrt(x)), "sign": np.sign, "sin": np.sin, "sinh": np.sinh,
    "sqrt": np.sqrt, "square": np.square, "tan": np.tan, "tanh": np.tanh, "trunc": np.trunc,
}
# Unary functions that keep integer tensors integer in torch; the rest compute in float32.
_INT_PRESERVING = {"abs", "neg", "sign", "square", "ceil", "floor", "round", "trunc"}

CASTS: dict[str, tuple[Callable[[Any], Any], np.dtype]] = {
    "int": (int, np.dtype(np.int64)), "torch.long": (int, np.dtype(np.int64)),
    "torch.int": (int, np.dtype(np.int32)), "torch.float": (float, np.dtype(np.float32)),
    "torch.double": (float, np.dtype(np.float64)), "torch.bool": (bool, np.dtype(np.bool_)),
}
FUNCTIONS = set(BINARY) | set(UNARY) | set(CASTS) | {"size"}


def _unary(name: str, x: Any) -> Any:
    if isinstance(x, np.ndarray):
        if x.dtype.kind in "iub" and name not in _INT_PRESERVING:
            x = x.astype(np.float32)
        return UNARY[name](x)
    if name == "erf":
        return math.erf(x)
    out = UNARY[name](np.float64(x) if isinstance(x, float) else x)
    return out.item() if isinstance(out, np.generic) else out


def _cast(name: str, x: Any) -> Any:
    py, dt = CASTS[name]
    return x.astype(dt) if isinstance(x, np.ndarray) else py(x)


def _size(args: list[Any]) -> Any:
    t = args[0]
    if not isinstance(t, (np.ndarray, _Abstract)):
        raise ExpressionError(f"size() of a non-tensor {t!r}")
    if len(args) == 1:
        if any(d < 0 for d in t.shape):
            return [_Abstract((), np.dtype(np.int64)) if d < 0 else d for d in t.shape]
        return list(t.shape)
    d = args[1]
    if not isinstance(d, int) or not -len(t.shape) <= d < len(t.shape):
        raise ExpressionError(f"size(t, {d!r}) out of range for a rank-{len(t.shape)} tensor")
    n = t.shape[d]
    return _Abstract((), np.dtype(np.int64)) if n < 0 else int(n)


def _broadcast(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """numpy broadcasting where -1 is an unknown dim."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, d in enumerate((1,) * (rank - len(s)) + tuple(s)):
            if d == 1 or d == out[i]:
                continue
            if out[i] == 1 or out[i] == -1:
                out[i] = d if d != -1 or out[i] == 1 else -1
            elif d != -1:
                raise ExpressionError(f"shapes {list(shapes)} do not broadcast")
    return tuple(out)


def _apply(name: str, args: list[Any]) -> Any:
    if name == "size":
        if len(args) not in (1, 2):
            raise ExpressionError(f"size() takes 1 or 2 arguments, got {len(args)}")
        return _size(args)
    arity = 2 if name in BINARY else 1
    if len(args) != arity:
        raise ExpressionError(f"{name}() takes {arity} argument(s), got {len(args)}")
    if any(isinstance(a, _Abstract) for a in args):
        return _apply_abstract(name, args)
    if any(isinstance(a, list) for a in args) or any(isinstance(a, (str, type(None))) for a in args):
        raise ExpressionError(f"{name}() cannot take {[type(a).__name__ for a in args]}")
    if name in CASTS:
        return _cast(name, args[0])
    if name in UNARY:
        return _unary(name, args[0])
    a, b = _promote(*args)
    return _narrowed(BINARY[name](a, b), a, b)


def _narrowed(out: Any, *operands: Any) -> Any:
    """torch keeps float math of int and float32 tensors in float32 where numpy widens to float64 (atan2 of int64
    tensors); a float64 result stays only when an operand was float64 (torch.double casts included)."""
    if isinstance(out, (np.ndarray, np.floating)) and out.dtype == np.float64:  # 0-d operands give numpy scalars
        if not any(isinstance(x, (np.ndarray, np.floating)) and x.dtype == np.float64 for x in operands):
            return out.astype(np.float32)
    return out


def _apply_abstract(name: str, args: list[Any]) -> _Abstract:
    """Result shape by broadcasting; result dtype by running the same function on 0-d stand-ins."""
    shapes = [a.shape for a in args if isinstance(a, (_Abstract, np.ndarray))]
    proxies = [np.ones((), a.dtype) if isinstance(a, (_Abstract, np.ndarray)) else a for a in args]
    if all(isinstance(a, _Abstract) and a.shape == () for a in args if isinstance(a, (_Abstract, np.ndarray))):
        proxies = [p.item() if isinstance(p, np.ndarray) else p for p in proxies]  # unknown python scalars
    out = _apply(name, proxies)
    dtype = np.dtype(np.float32) if type(out) is float else np.asarray(out).dtype
    return _Abstract(_broadcast(shapes), dtype)


def evaluate(tree: Expr, operands: Sequence[Any]) -> Any:
    """Evaluates a parsed expression on operands (arrays, python scalars, lists, or _Abstract)."""
    if isinstance(tree, Input):
        if tree.index >= len(operands):
            raise ExpressionError(f"@{tree.index} used but the op has {len(operands)} inputs")
        return operands[tree.index]
    if isinstance(tree, Lit):
        return tree.value
    if isinstance(tree, ListExpr):
        return [evaluate(item, operands) for item in tree.items]
    args = [evaluate(a, operands) for a in tree.args]
    try:
        with np.errstate(all="ignore"):
            return _apply(tree.name, args)
    except (TypeError, ValueError, ZeroDivisionError, OverflowError, IndexError) as e:
        raise ExpressionError(f"{tree.name}() failed: {e}") from None


# -- conversion to and from the runtime's representation -------------------------------------------------------
def _operand(x: np.ndarray) -> Any:
    """0-d integer/bool host values behave as python scalars (they come from shape arithmetic)."""
    x = np.asarray(x)
    return x.item() if x.ndim == 0 and x.dtype.kind in "iub" else x


def _to_array(result: Any, float_dtype: np.dtype) -> np.ndarray:
    if isinstance(result, list):
        if not all(isinstance(r, (bool, int, float, np.integer, np.floating, np.bool_)) for r in result):
            raise ExpressionError(f"a list result must hold numbers, got {result!r}")
        if all(isinstance(r, (bool, int, np.integer)) for r in result):
            return np.array(result, np.int64)
        return np.array(result, float_dtype)
    if isinstance(result, bool):
        return np.array(result, np.bool_)
    if isinstance(result, int):
        return np.array(result, np.int64)
    if isinstance(result, float):
        return np.array(result, float_dtype)
    if isinstance(result, (complex, str)) or result is None:
        raise ExpressionError(f"expression result {result!r} is not a tensor or number")
    return np.asarray(result)


def run(expr: str, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Evaluates `expr` on concrete arrays, keeping float32 results float32."""
    result = evaluate(parse(expr), [_operand(a) for a in arrays])
    return _to_array(result, np.dtype(np.float32))


def infer_info(expr: str, ins: Sequence[TensorInfo]) -> TensorInfo:
    """Shape/dtype of the result; `value` is filled in when it follows from known values and shapes alone."""
    operands = [_operand(i.value) if i.value is not None else _Abstract(tuple(i.shape), np.dtype(i.dtype))
                for i in ins]
    result = evaluate(parse(expr), operands)
    if isinstance(result, _Abstract):
        return TensorInfo(result.shape, result.dtype)
    if isinstance(result, list) and any(isinstance(r, _Abstract) for r in result):
        return TensorInfo((len(result),), np.dtype(np.int64))
    value = _to_array(result, np.dtype(np.float32))
    return TensorInfo(tuple(value.shape), value.dtype, value)


def _infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    try:
        return [infer_info(node.params["expr"], ins)]
    except ExpressionError as e:
        raise ShapeError(f"{node.where()}: {e}") from None


def _reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    try:
        return [run(node.params["expr"], arrays)]
    except ExpressionError as e:
        raise ShapeError(f"{node.where()}: {e}") from None


register(OpDef("Expression", infer=_infer, reference=_reference))
