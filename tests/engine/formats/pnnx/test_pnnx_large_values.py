"""A .pnnx.param line with a huge inline value (a list param of millions of items, an annotation with as many dims)
is read in time linear in its length and, when it is wrong, refused with a short error naming the file and line.
Linearity is checked by what runs per item, not by timing: a numeric list is read by int / float over the whole
list, never by parse_scalar's tests item by item (a 50 MB list took minutes)."""

from __future__ import annotations

import pytest

from engine.errors import ModelFormatError
from engine.formats.pnnx import param_values
from engine.formats.pnnx.param_values import parse_param, parse_scalar
from engine.formats.pnnx.reader import load_graph

ITEMS = 1_000_000  # a line of a few MB


def write(tmp_path, line: str):
    path = tmp_path / "big.pnnx.param"
    path.write_text("7767517\n3 3\npnnx.Input in0 0 1 0 #0=(1,8)f32\n" + line
                    + "\npnnx.Output out0 1 0 1\n")
    return path


@pytest.fixture
def scalar_calls(monkeypatch):
    calls = []

    def counted(text):
        calls.append(text)
        return parse_scalar(text)
    monkeypatch.setattr(param_values, "parse_scalar", counted)
    return calls


@pytest.mark.parametrize("item, value", [("7", 7), ("-3", -3), ("1.500000e-01", 0.15), ("2.0", 2.0), ("3.", 3.0)])
def test_a_long_numeric_list_is_read_whole(tmp_path, scalar_calls, item, value):
    graph = load_graph(write(tmp_path, f"torch.permute p 1 1 0 1 dims=({','.join([item] * ITEMS)}) $input=0"))
    dims = graph.nodes[0].params["dims"]
    assert len(dims) == ITEMS and dims[0] == dims[-1] == value and type(dims[-1]) is type(value)
    assert not scalar_calls


@pytest.mark.parametrize("text", ["(1,2,3)", "(-1,0,7)", "(1.0,2.5e-3,-3.)", "(1,2.0)", "(1e5,2E-3)", "(a,b)",
                                  "(1,None)", "(+1,2)", "(1_0,2)", "(inf,1.0)", "(1.0j,2)", "[1,-2]", "(0x1,2)",
                                  "(1,-)", "(-,1)", "(--1,2)", "(1-2,3)", "(1,,2)", "(,1)", "(1,)", "(-1,-2)",
                                  "(1," + "9" * 5000 + ")", "(١,2)"])
def test_whole_list_reading_gives_what_each_item_gives(text):
    def outcome(read):
        try:
            values = read()
        except ValueError as e:
            return str(e)
        return repr(values), [type(v) for v in values]
    assert outcome(lambda: parse_param(text)) == outcome(lambda: [parse_scalar(t) for t in text[1:-1].split(",")])


def test_a_long_annotation_is_read(tmp_path):
    dims = ",".join(["1"] * ITEMS)
    graph = load_graph(write(tmp_path, f"nn.ReLU r 1 1 0 1 #0=(1,8)f32 #1=({dims})f32"))
    assert graph.nodes[0].outputs[0].shape == (1,) * ITEMS


@pytest.mark.parametrize("item, words", [
    ("dims=(" + ",".join(["1"] * ITEMS) + ",x,(2))", "nested list '(1,1,1"),
    ("dims=(" + ",".join(["1"] * ITEMS), "unterminated list '(1,1,1"),
    ("#1=(" + ",".join(["1"] * ITEMS) + ",x)f32", "bad dim 'x' in '(1,1,1"),
    ("#1=(" + ",".join(["1"] * ITEMS) + ")", "malformed shape/dtype '(1,1,1"),
    ("dims" + "1" * ITEMS, "malformed item '"),
    ("dims=1" + "." * ITEMS, "malformed number '1..."),
])
def test_a_huge_malformed_value_is_refused_in_a_short_message(tmp_path, item, words):
    with pytest.raises(ModelFormatError) as e:
        load_graph(write(tmp_path, f"torch.permute p 1 1 0 1 $input=0 {item}"))
    assert e.value.path.endswith("big.pnnx.param") and e.value.line == 4
    assert words in str(e.value) and "characters)" in str(e.value) and len(str(e.value)) < 400, str(e.value)[:400]


@pytest.mark.parametrize("text, line, words", [
    ("7767517\n" + "9" * 5000 + " 2\n", 2, "operator count '999"),
    ("7767517\n2 " + "9" * 19 + "\n", 2, "operand count '9999999999999999999'"),
    ("7767517\n1 1\npnnx.Input in0 " + "9" * 5000 + " 1 0\n", 3, "input count '999"),
    ("7767517\n2 2\npnnx.Input in0 0 1 0\nnn.ReLU r 1 1 0 1 #1=(1," + "9" * 5000 + ")f32\n", 4, "dim '999"),
    ("7767517\n2 2\npnnx.Input in0 0 1 0\nnn.ReLU r 1 1 0 1 @weight=(1," + "9" * 19 + ")f32\n", 4, "dim '999"),
])
def test_every_count_and_dim_is_checked_before_use(tmp_path, text, line, words):
    # a count or a dim from the file is bounded before anything is sized from it; the error names file and line
    path = tmp_path / "m.pnnx.param"
    path.write_text(text)
    with pytest.raises(ModelFormatError) as e:
        load_graph(path)
    assert e.value.line == line and words in str(e.value) and "too large" in str(e.value), str(e.value)[:300]
