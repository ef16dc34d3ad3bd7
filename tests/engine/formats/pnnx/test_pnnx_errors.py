"""Every malformed pnnx input raises ModelFormatError naming the file and the line (or the byte offset)."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

from engine.errors import ModelFormatError
from engine.formats.pnnx.reader import load_graph
from engine.formats.pnnx.writer import write_pnnx

GOOD = """7767517
4 4
pnnx.Input               pnnx_input_0             0 1 0 #0=(1,2,4,4)f32
nn.Conv2d                conv                     1 1 0 1 bias=True dilation=(1,1) groups=1 in_channels=2 kernel_size=(1,1) out_channels=3 padding=(0,0) padding_mode=zeros stride=(1,1) @bias=(3)f32 @weight=(3,2,1,1)f32 #0=(1,2,4,4)f32 #1=(1,3,4,4)f32
F.relu                   relu                     1 1 1 2 $input=1 #1=(1,3,4,4)f32 #2=(1,3,4,4)f32
pnnx.Output              pnnx_output_0            1 0 2
"""  # noqa: E501
WEIGHTS = {"conv.weight": np.ones((3, 2, 1, 1), np.float32), "conv.bias": np.zeros(3, np.float32)}


def _load(tmp_path, text, weights=None):
    return load_graph(write_pnnx(tmp_path / "m.pnnx.param", text, WEIGHTS if weights is None else weights))


def _replace_line(n: int, new: str) -> str:
    lines = GOOD.splitlines()
    lines[n - 1] = new
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text, line, words", [
    ("7767518\n0 0\n", 1, "magic"),
    ("", 1, "empty"),
    ("7767517\nx 4\n", 2, "operator_count"),
    ("7767517\n4\n", 2, "operator_count"),
    (GOOD.replace("4 4\n", "5 4\n"), 6, "announces 5 operators"),
    (GOOD.replace("4 4\n", "3 4\n"), 6, "announces 3 operators"),
    (_replace_line(5, "F.relu relu 1"), 5, "must start with"),
    (_replace_line(5, "F.relu relu x 1 1 2"), 5, "must start with"),
    (_replace_line(5, "F.relu relu 1 1 1"), 5, "expects 1 inputs and 1 outputs"),
    (_replace_line(5, "F.relu relu 1 1 7 2"), 5, "operand '7' is used before"),
    (_replace_line(5, "F.relu relu 1 1 1 0"), 5, "produced twice"),
    (_replace_line(5, "F.relu relu 1 1 1 2 dim"), 5, "malformed item"),
    (_replace_line(5, "F.relu relu 1 1 1 2 dim="), 5, "malformed item"),
    (_replace_line(5, "F.relu relu 1 1 1 2 @=(1)f32"), 5, "malformed item"),
    (_replace_line(5, "F.relu relu 1 1 1 2 dim=1.2.3"), 5, "malformed number"),
    (_replace_line(5, "F.relu relu 1 1 1 2 dim=(1,2"), 5, "unterminated list"),
    (_replace_line(5, "F.relu relu 1 1 1 2 dim=(1,,2)"), 5, "empty value"),
    (_replace_line(5, "F.relu relu 1 1 1 2 #2=(1,3)f99"), 5, "unknown dtype"),
    (_replace_line(5, "F.relu relu 1 1 1 2 #2=(1,x)f32"), 5, "bad dim"),
    (_replace_line(5, "F.relu relu 1 1 1 2 #2=1,3f32"), 5, "malformed shape"),
    (_replace_line(5, "F.relu relu 1 1 1 2 #9=(1)f32"), 5, "does not use"),
    (_replace_line(5, "F.relu relu 1 1 1 2 $input=9"), 5, "not an (untagged) input"),
    (_replace_line(5, "F.relu relu 1 1 1 2 @w=(?,2)f32"), 5, "dynamic dim"),
    (_replace_line(5, "F.relu relu 1 1 1 2 @w=(2)c32"), 5, "not supported"),
    (_replace_line(3, "pnnx.Input in 1 1 0 0"), 3, "used before"),
    (_replace_line(3, "pnnx.Attribute a 0 1 0"), 3, "no @data"),
    (_replace_line(6, "pnnx.Output out 1 1 2 3"), 6, "expects 0 inputs and 0 outputs"),
])
def test_param_errors_name_file_and_line(tmp_path, text, line, words):
    with pytest.raises(ModelFormatError) as e:
        _load(tmp_path, text)
    assert e.value.path.endswith("m.pnnx.param") and e.value.line == line, str(e.value)
    assert words in str(e.value)


def test_graph_without_outputs(tmp_path):
    p = tmp_path / "m.pnnx.param"
    p.write_text("7767517\n1 1\npnnx.Input in 0 1 0 #0=(1)f32\n")
    with pytest.raises(ModelFormatError, match="no outputs"):
        load_graph(p)


def test_binary_garbage_reports_an_offset(tmp_path):
    p = tmp_path / "m.pnnx.param"
    p.write_bytes(b"7767517\n1 1\n\xff\xfe")
    with pytest.raises(ModelFormatError, match="UTF-8") as e:
        load_graph(p)
    assert e.value.offset == 12


def test_missing_bin_names_it(tmp_path):
    p = tmp_path / "m.pnnx.param"
    p.write_text(GOOD)
    with pytest.raises(ModelFormatError, match="weights file missing") as e:
        load_graph(p)
    assert e.value.path.endswith("m.pnnx.bin") and "m.pnnx.param:4" in str(e.value)


def test_missing_entry(tmp_path):
    with pytest.raises(ModelFormatError, match="missing zip entry 'conv.bias'"):
        _load(tmp_path, GOOD, {"conv.weight": WEIGHTS["conv.weight"]})


@pytest.mark.parametrize("bias", [np.zeros(2, np.float32), np.zeros(4, np.float32), np.zeros(3, np.float64)])
def test_entry_size_must_match_exactly(tmp_path, bias):
    with pytest.raises(ModelFormatError, match="'conv.bias' holds") as e:
        _load(tmp_path, GOOD, {**WEIGHTS, "conv.bias": bias})
    assert e.value.path.endswith("m.pnnx.bin") and e.value.offset is not None


def test_compressed_entry_is_refused(tmp_path):
    p = tmp_path / "m.pnnx.param"
    p.write_text(GOOD)
    with zipfile.ZipFile(tmp_path / "m.pnnx.bin", "w", compression=zipfile.ZIP_DEFLATED) as z:
        for k, v in WEIGHTS.items():
            z.writestr(k, v.tobytes())
    with pytest.raises(ModelFormatError, match="compressed"):
        load_graph(p)


@pytest.mark.parametrize("data", [b"", b"PK\x03\x04", b"not a zip at all" * 10])
def test_not_a_zip(tmp_path, data):
    p = tmp_path / "m.pnnx.param"
    p.write_text(GOOD)
    (tmp_path / "m.pnnx.bin").write_bytes(data)
    with pytest.raises(ModelFormatError) as e:
        load_graph(p)
    assert e.value.offset is not None


def test_truncated_bin_reports_offset(tmp_path):
    p = write_pnnx(tmp_path / "m.pnnx.param", GOOD, WEIGHTS)
    raw = (tmp_path / "m.pnnx.bin").read_bytes()
    # Keep the directory but drop the entry data: headers now point past the end or at garbage.
    (tmp_path / "m.pnnx.bin").write_bytes(raw[:40] + raw[-200:])
    with pytest.raises(ModelFormatError) as e:
        load_graph(p)
    assert e.value.offset is not None


def test_tuple_into_an_ordinary_op_is_a_format_error(tmp_path):
    text = ("7767517\n4 3\npnnx.Input in 0 1 0\nprim::TupleConstruct t 1 1 0 1\nF.relu r 1 1 1 2\n"
            "pnnx.Output out 1 0 2\n")
    p = tmp_path / "m.pnnx.param"
    p.write_text(text)
    with pytest.raises(ModelFormatError, match="m.pnnx.param:5"):
        load_graph(p)
