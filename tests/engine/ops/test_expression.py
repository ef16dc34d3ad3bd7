"""The pnnx expression language against PyTorch (tests/fixtures/ops/expression.npz, tools/make_expression_goldens.py)
plus parser errors and infer-time shape arithmetic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops import get_op
from engine.ops.expression import Call, ExpressionError, Input, ListExpr, Lit, infer_info, parse, run, tokenize
from engine.ops.registry import TensorInfo

GOLDEN = np.load(Path(__file__).resolve().parents[2] / "fixtures" / "ops" / "expression.npz")
CASES = sorted({k.split("/")[0] for k in GOLDEN.files})
F32 = np.dtype(np.float32)


def _case(name: str) -> tuple[str, list[np.ndarray], np.ndarray]:
    n_in = sum(1 for k in GOLDEN.files if k.startswith(f"{name}/in"))
    return str(GOLDEN[f"{name}/expr"]), [GOLDEN[f"{name}/in{i}"] for i in range(n_in)], GOLDEN[f"{name}/out"]


@pytest.mark.parametrize("name", CASES)
def test_matches_torch(name):
    expr, ins, want = _case(name)
    got = run(expr, ins)
    assert got.shape == want.shape
    if ins[0].ndim and not name.startswith("size"):
        assert got.dtype == want.dtype, f"{expr}: {got.dtype} vs torch {want.dtype}"
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("name", CASES)
def test_infer_agrees_with_evaluation(name):
    expr, ins, want = _case(name)
    info = infer_info(expr, [TensorInfo(a.shape, a.dtype) for a in ins])
    got = run(expr, ins)
    assert info.shape == got.shape and info.dtype == got.dtype
    if name.startswith("size"):  # shape arithmetic is known from shapes alone
        np.testing.assert_allclose(info.value, want, rtol=1e-6)
    else:
        assert info.value is None


def test_parse_tree():
    assert parse("add(@0,mul(@1,2.0))") == Call("add", (Input(0), Call("mul", (Input(1), Lit(2.0)))))
    assert parse("[size(@0,2),size(@0,3)]") == ListExpr((Call("size", (Input(0), Lit(2))),
                                                         Call("size", (Input(0), Lit(3)))))
    assert parse("[]") == ListExpr(())
    assert parse("torch.float(@0)") == Call("torch.float", (Input(0),))
    assert parse("mul(@0,1.000000e-6)") == Call("mul", (Input(0), Lit(1e-6)))
    assert parse("True") == Lit(True) and parse("-3") == Lit(-3)
    assert tokenize("add(@0,[1,2])") == ["add", "(", "@0", ",", "[", "1", ",", "2", "]", ")"]


@pytest.mark.parametrize("text", ["", "add(@0", "add(@0,@1))", "foo(@0)", "@x", "@", "[,]", "add(,@0)",
                                  "add(@0 @1)", "1.2.3", "(", ")", "add" + "(" * 300 + "@0" + ")" * 300])
def test_parse_errors(text):
    with pytest.raises(ExpressionError, match="expression"):
        parse(text)


@pytest.mark.parametrize("expr, ins", [
    ("add(@0,@1)", [np.zeros((2, 3), F32), np.zeros((4,), F32)]),
    ("size(@0,4)", [np.zeros((2, 3), F32)]),
    ("add(@0,@3)", [np.zeros((2, 3), F32)]),
    ("and(@0,1.5)", [np.zeros((2, 3), F32)]),
    ("add(@0)", [np.zeros((2, 3), F32)]),
    ("sqrt(@0,@0)", [np.zeros((2, 3), F32)]),
    ("floor_divide(size(@0,0),0)", [np.zeros((2, 3), F32)]),
    ("add([1,2],@0)", [np.zeros((2,), F32)]),
])
def test_evaluation_errors_are_expression_errors(expr, ins):
    with pytest.raises(ExpressionError):
        run(expr, ins)


def test_float32_is_kept_with_float_literals():
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    for expr in ("mul(@0,0.353553385)", "add(@0,1.000000e-6)", "sub(1.0,@0)", "pow(@0,2.0)", "max(@0,0.5)"):
        assert run(expr, [x]).dtype == np.float32, expr
    np.testing.assert_allclose(run("sub(1.0,@0)", [x]), 1.0 - x.astype(np.float64), rtol=1e-6)


def test_dynamic_dims_leave_the_value_unknown():
    info = infer_info("[size(@0,2),size(@0,3)]", [TensorInfo((1, 3, -1, 8), F32)])
    assert info.shape == (2,) and info.dtype == np.int64 and info.value is None
    info = infer_info("add(@0,@1)", [TensorInfo((1, 3, -1, 8), F32), TensorInfo((1, 3, 1, 1), F32)])
    assert info.shape == (1, 3, -1, 8)


def test_known_values_are_folded_and_host_scalars_act_like_python_ints():
    size = TensorInfo((), np.dtype(np.int64), np.array(7))
    info = infer_info("[div(@0,2),floor_divide(@0,2)]", [size])
    np.testing.assert_allclose(info.value, [3.5, 3.0])
    info = infer_info("mul(@0,@1)", [TensorInfo((2,), F32, np.array([1.5, 2], F32)), size])
    assert info.value.dtype == np.float32 and info.value.tolist() == [10.5, 14.0]


def test_expression_op_is_registered():
    op = get_op("Expression")
    node = Node("Expression", "pnnx_expr_7", params={"expr": "[size(@0,2),size(@0,3)]"}, source="m.pnnx.param:7")
    out = op.infer(node, [TensorInfo((1, 3, 40, 56), F32)])
    assert out[0].value.tolist() == [40, 56]
    np.testing.assert_array_equal(op.reference(node, [np.zeros((1, 3, 40, 56), F32)])[0], [40, 56])
    bad = Node("Expression", "e", params={"expr": "add(@0,@1)"}, source="m.pnnx.param:9")
    with pytest.raises(ShapeError, match="m.pnnx.param:9"):
        op.reference(bad, [np.zeros((2, 3), F32), np.zeros(4, F32)])


# -- fuzzing -------------------------------------------------------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_ATOMS = st.sampled_from(["@0", "@1", "@7", "2", "-3", "0.5", "1.000000e-6", "True", "None", "torch.float", "x"])
_NAMES = st.sampled_from(["add", "sub", "div", "floor_divide", "remainder", "pow", "sqrt", "neg", "size", "int",
                          "max", "and", "lshift", "erf", "torch.float", "atan2", "round"])


@st.composite
def _trees(draw, depth=0):
    kind = draw(st.integers(0, 2 if depth < 4 else 0))
    if kind == 0:
        return draw(_ATOMS)
    if kind == 1:
        return "[" + ",".join(draw(st.lists(_trees(depth + 1), max_size=3))) + "]"
    return draw(_NAMES) + "(" + ",".join(draw(st.lists(_trees(depth + 1), min_size=1, max_size=3))) + ")"


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="@0123456789(),[].-eaddmulsizeTrueNone", max_size=40))
def test_random_text_only_raises_expression_errors(text):
    try:
        parse(text)
    except ExpressionError:
        pass


def test_an_explicit_double_cast_stays_float64():
    ins = [np.arange(3, dtype=np.int64)]
    for expr in ("torch.double(@0)", "atan2(torch.double(@0),@0)"):
        out = run(expr, ins)
        info = infer_info(expr, [TensorInfo(a.shape, a.dtype) for a in ins])
        assert out.dtype == info.dtype == np.float64, expr


@pytest.mark.parametrize("expr", ["atan2(@0,@0)", "atan2(@0,2)", "logaddexp(@0,@0)"])
def test_float_math_of_integer_tensors_is_float32_in_inference_and_run(expr):
    """numpy widens these to float64, torch gives float32: inference must say what run returns (found by the
    random-expression test below)."""
    ins = [np.arange(3, dtype=np.int64)]
    out = run(expr, ins)
    info = infer_info(expr, [TensorInfo(a.shape, a.dtype) for a in ins])
    known = infer_info(expr, [TensorInfo(a.shape, a.dtype, a) for a in ins])
    assert out.dtype == info.dtype == known.dtype == np.float32


@settings(max_examples=300, deadline=None)
@given(expr=_trees())
def test_random_expressions_evaluate_or_raise_expression_errors(expr):
    ins = [np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3), np.arange(3, dtype=np.int64)]
    try:
        out = run(expr, ins)
    except ExpressionError:
        return
    info = infer_info(expr, [TensorInfo(a.shape, a.dtype) for a in ins])
    assert info.shape == out.shape and info.dtype == out.dtype
