"""Writes tests/fixtures/ops/expression.npz: PyTorch results of pnnx expression strings (pnnx-format.md §6).

Run with the dev environment (torch): `.venv-dev/bin/python tools/make_expression_goldens.py`.
Each expression is evaluated the way pnnx's generated Python evaluates it: torch functions on tensors, Python
arithmetic on the ints that `size()` returns. Case `c` is stored as `c/expr`, `c/in<i>`, `c/out`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engine.ops.expression import Call, Input, ListExpr, Lit, parse

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "ops" / "expression.npz"
RNG = np.random.default_rng(20261122)

BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "floor_divide": lambda a, b: a // b,
    "remainder": lambda a, b: a % b,
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
    "lshift": lambda a, b: a << b,
    "rshift": lambda a, b: a >> b,
    "pow": lambda a, b: a**b,
}
TENSOR_BINARY = {
    "atan2": torch.atan2,
    "fmod": torch.fmod,
    "max": torch.max,
    "min": torch.min,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "logaddexp": torch.logaddexp,
}
UNARY = [
    "abs",
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atanh",
    "ceil",
    "cos",
    "cosh",
    "erf",
    "exp",
    "expm1",
    "floor",
    "log",
    "log10",
    "log1p",
    "neg",
    "reciprocal",
    "round",
    "rsqrt",
    "sign",
    "sin",
    "sinh",
    "sqrt",
    "square",
    "tan",
    "tanh",
    "trunc",
]


def as_tensor(x, like):
    return x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=like.dtype)


def torch_eval(tree, ins):
    if isinstance(tree, Input):
        return ins[tree.index]
    if isinstance(tree, Lit):
        return tree.value
    if isinstance(tree, ListExpr):
        return [torch_eval(t, ins) for t in tree.items]
    args = [torch_eval(a, ins) for a in tree.args]
    assert isinstance(tree, Call)
    if tree.name == "size":
        return args[0].size(args[1]) if len(args) == 2 else list(args[0].shape)
    if tree.name == "int":
        return int(args[0])
    if tree.name in BINARY:
        return BINARY[tree.name](*args)
    if tree.name in TENSOR_BINARY:
        t = next(a for a in args if isinstance(a, torch.Tensor))
        return TENSOR_BINARY[tree.name](*(as_tensor(a, t) for a in args))
    return getattr(torch, tree.name)(args[0])


CASES: dict[str, np.ndarray] = {}


def case(name: str, expr: str, *inputs: np.ndarray) -> None:
    out = torch_eval(parse(expr), [torch.from_numpy(np.ascontiguousarray(a)) for a in inputs])
    CASES[f"{name}/expr"] = np.array(expr)
    for i, a in enumerate(inputs):
        CASES[f"{name}/in{i}"] = a
    CASES[f"{name}/out"] = out.numpy() if isinstance(out, torch.Tensor) else np.array(out)


def f32(*shape, lo=-3.0, hi=3.0):
    return RNG.uniform(lo, hi, shape).astype(np.float32)


def i64(*shape, lo=-9, hi=10):
    return RNG.integers(lo, hi, shape).astype(np.int64)


def main() -> None:
    a, b, c = f32(2, 3, 4, 5), f32(2, 3, 4, 5), f32(1, 3, 1, 1)
    case("residual", "add(@0,@1)", a, b)
    case("fused3", "sub(add(@0,@1),mul(@2,0.5))", a, b, f32(2, 3, 4, 5))
    case("affine_attr", "add(mul(@0,@1),@2)", a, c, f32(1, 3, 1, 1))
    case("chain_unary", "mul(sqrt(add(abs(@0),1.000000e-6)),exp(neg(@0)))", a)
    case("scale", "mul(@0,0.353553385)", a)
    case("rsub_alpha", "add(@0,mul(@1,2.0))", a, c)
    case("literal_first", "sub(1.0,div(1,@0))", f32(3, 4, lo=0.5, hi=2.0))
    for op in ("div", "floor_divide", "remainder", "fmod", "atan2", "max", "min", "maximum", "minimum", "logaddexp"):
        case(f"bin_{op}", f"{op}(@0,@1)", f32(4, 5), f32(5, lo=0.5, hi=2.0) * np.array([1, -1, 1, -1, 1], np.float32))
    case("pow_lit", "pow(@0,2.0)", a)
    case("pow_base", "pow(2.0,@0)", a)
    case("max_lit", "max(@0,0.25)", a)
    case("floor_divide_lit", "floor_divide(@0,-0.75)", a)
    case("remainder_lit", "remainder(@0,-3)", i64(4, 6))
    case("int_div", "div(@0,@1)", i64(3, 4), i64(4, lo=1, hi=5))
    case("int_floor_divide", "floor_divide(@0,@1)", i64(3, 4), i64(4, lo=1, hi=5) * np.array([1, -1, 1, -1]))
    case("int_plus_float", "add(@0,0.5)", i64(3, 4))
    case("int_times_int", "mul(@0,3)", i64(3, 4))
    case("int_neg_abs", "abs(neg(@0))", i64(3, 4))
    case("int_exp", "exp(@0)", i64(3, 4, lo=-3, hi=3))
    case("bool_ops", "xor(and(@0,@1),or(@0,@1))", RNG.random((3, 4)) > 0.5, RNG.random((3, 4)) > 0.5)
    case("shifts", "rshift(lshift(@0,2),1)", i64(3, 4, lo=0, hi=50))
    case("round_half_even", "round(@0)", np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49], np.float32))
    domains = {
        "acos": (-0.9, 0.9),
        "asin": (-0.9, 0.9),
        "atanh": (-0.9, 0.9),
        "acosh": (1.1, 4.0),
        "log": (0.1, 4.0),
        "log10": (0.1, 4.0),
        "log1p": (-0.5, 4.0),
        "sqrt": (0.1, 4.0),
        "rsqrt": (0.1, 4.0),
        "reciprocal": (0.5, 4.0),
    }
    for op in UNARY:
        lo, hi = domains.get(op, (-3.0, 3.0))
        case(f"un_{op}", f"{op}(@0)", f32(3, 7, lo=lo, hi=hi))
    s = np.zeros((2, 3, 5, 7), np.float32)
    case("size_list", "[size(@0,2),size(@0,3)]", s)
    case("size_arith", "mul(size(@0,0),add(size(@0,-1),1))", s)
    case("size_div", "div(size(@0,3),2)", s)
    case("size_floordiv", "int(floor_divide(size(@0,3),2))", s)
    case("size_all", "size(@0)", s)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **CASES)
    print(f"wrote {len(CASES)} arrays to {OUT}")


if __name__ == "__main__":
    main()
