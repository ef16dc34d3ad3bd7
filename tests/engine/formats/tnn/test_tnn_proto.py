"""The .tnnproto reader: both versions, TNN's tokenization quirks, errors with lines, and every real graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.errors import ModelFormatError, UnsupportedOpError
from engine.formats.tnn.constants import is_known_type
from engine.formats.tnn.reader import load_graph
from engine.formats.tnn.tnnproto import parse_proto, parse_proto_text

SHARED = Path(__file__).resolve().parents[4].parent / "shared"
TNN_MODELS = SHARED / "models" / "tnn"

V1 = '''"1 3 1 4206624770 ,"
"data 1 3 8 8 ,"
" data conv relu ,"
"relu ,"
" 2 ,"
"Convolution conv 1 1 data conv 1 3 4 3 3 1 1 1 1 1 -1 1 1 ,"
"ReLU relu 1 1 conv relu ,"
'''

V2 = '''"1 4 1 4206624772 ,"
"ids 2 1 16 3 : mask 2 1 16 3 : x 4 1 3 8 8 0 ,"
" a b ,"
"a b ,"
" 2 ,"
"Add a 2 1 x x a -1 ,"
"Mul b 1 1 a b 1 ,"
'''


def test_v1_header_inputs_layers():
    p = parse_proto_text(V1, "m.tnnproto")
    assert (p.version, p.blob_count) == (1, 3)
    assert [(i.name, i.shape, i.dtype_code) for i in p.inputs] == [("data", (1, 3, 8, 8), 0)]
    assert p.outputs == ["relu"]
    conv, relu = p.layers
    assert (conv.type, conv.name, conv.line) == ("Convolution", "conv", 6)
    assert (conv.inputs, conv.outputs) == (["data"], ["conv"])
    assert conv.params == "1 3 4 3 3 1 1 1 1 1 -1 1 1".split()
    assert (relu.type, relu.params, relu.line) == ("ReLU", [], 7)


def test_v2_multiple_inputs_with_rank_and_dtype():
    p = parse_proto_text(V2)
    assert p.version == 2
    assert [(i.name, i.shape, i.dtype_code) for i in p.inputs] == [
        ("ids", (1, 16), 3), ("mask", (1, 16), 3), ("x", (1, 3, 8, 8), 0)]
    assert p.outputs == ["a", "b"]
    assert [layer.params for layer in p.layers] == [["-1"], ["1"]]


def test_v2_input_without_dtype_token_is_float():
    text = V2.replace("ids 2 1 16 3 : mask 2 1 16 3 : x 4 1 3 8 8 0", "x 4 1 3 224 224")
    (inp,) = parse_proto_text(text).inputs
    assert (inp.shape, inp.dtype_code) == ((1, 3, 224, 224), 0)


def test_records_end_at_commas_not_newlines():
    # TNN drops every quote and newline, then splits on commas: a layer may span lines, blank pieces vanish.
    text = V1.replace('"ReLU relu 1 1 conv relu ,"', '"ReLU relu\n 1 1\r conv relu ,",,')
    p = parse_proto_text(text)
    assert [(layer.type, layer.outputs, layer.line) for layer in p.layers][-1] == ("ReLU", ["relu"], 7)


def test_graph_from_proto_only_keeps_types_params_and_sources(tmp_path):
    (tmp_path / "m.tnnproto").write_text(V1)
    g = load_graph(tmp_path / "m.tnnproto", weights=False)
    assert [n.op_type for n in g.nodes] == ["tnn:Convolution", "tnn:ReLU"]
    assert g.nodes[0].params["args"][:3] == ["1", "3", "4"]
    assert g.nodes[0].source == "m.tnnproto:6"
    assert g.meta["format"] == "tnn" and g.meta["version"] == 1
    assert g.inputs[0].dtype == np.float32 and g.inputs[0].shape == (1, 3, 8, 8)
    assert [v.name for v in g.outputs] == ["relu"]


@pytest.mark.parametrize("text, line, needle", [
    (V1.replace("4206624770", "4206624771"), 1, "magic"),
    (V1.replace('"1 3 1 4206624770 ,"', '"1 3 ,"'), 1, "header"),
    (V1.replace("data 1 3 8 8", "data"), 2, "input"),
    (V2.replace("x 4 1 3 8 8 0", "x 4 1 3 8"), 2, "rank"),
    (V2.replace("x 4 1 3 8 8 0", "x 4 1 3 8 8 77"), 2, "data type"),
    (V1.replace("1 1 conv relu", "1 x conv relu"), 7, "integer"),
    (V1.replace("1 1 conv relu", "1 9 conv relu"), 7, "do not fit"),
    ('"1 3 1 4206624770 ,"\n"data 1 3 8 8 ,"', 2, "at least 6"),
])
def test_malformed_proto_names_the_line(text, line, needle):
    with pytest.raises(ModelFormatError) as e:
        parse_proto_text(text, "bad.tnnproto")
    assert e.value.line == line and needle in str(e.value) and "bad.tnnproto" in str(e.value)


def test_unknown_layer_type_names_type_and_line():
    with pytest.raises(UnsupportedOpError) as e:
        parse_proto_text(V1.replace('"ReLU relu', '"FancyOp relu'), "m.tnnproto")
    assert "FancyOp" in str(e.value) and "m.tnnproto:7" in str(e.value) and "relu" in str(e.value)


def test_missing_file_and_binary_garbage(tmp_path):
    with pytest.raises(ModelFormatError):
        parse_proto(tmp_path / "nope.tnnproto")
    (tmp_path / "bin.tnnproto").write_bytes(b"\xff\xfe\x00,\x80")
    with pytest.raises(ModelFormatError):
        parse_proto(tmp_path / "bin.tnnproto")


def test_unresolved_input_with_weights_is_an_error(tmp_path):
    from engine.formats.tnn.reader import build_graph
    from engine.formats.tnn.tnnmodel import TnnModelData

    p = parse_proto_text(V1.replace("1 1 conv relu", "1 1 ghost relu"), "m.tnnproto")
    with pytest.raises(ModelFormatError, match="ghost") as e:
        build_graph(p, TnnModelData("m.tnnmodel", 1))
    assert e.value.line == 7


# -- every real graph ---------------------------------------------------------------------------------------------
def _real_protos() -> list[Path]:
    return sorted(TNN_MODELS.glob("**/*.tnnproto")) if TNN_MODELS.is_dir() else []


def _records(path: Path) -> list[str]:
    return path.read_text().replace('"', "").replace("\n", "").split(",")


@pytest.mark.shared
@pytest.mark.skipif(not TNN_MODELS.is_dir(), reason="../shared/models/tnn is not available")
@pytest.mark.parametrize("path", _real_protos(), ids=lambda p: p.name)
def test_every_real_proto_parses(path):
    p = parse_proto(path)
    records = _records(path)
    assert len(p.layers) == int(records[4]) > 0  # the layer-count record agrees
    assert p.version == (2 if records[0].split()[3] == "4206624772" else 1)
    assert p.outputs == records[3].split()
    assert all(is_known_type(layer.type) for layer in p.layers)
    lines = path.read_text().splitlines()
    for layer in p.layers:  # sources point at the layer's own line
        assert lines[layer.line - 1].lstrip('" ').startswith(f"{layer.type} {layer.name} ")
    g = load_graph(path, weights=False)
    assert len(g.nodes) == len(p.layers)
    assert [v.name for v in g.outputs] == p.outputs


@pytest.mark.shared
@pytest.mark.skipif(not TNN_MODELS.is_dir(), reason="../shared/models/tnn is not available")
@pytest.mark.parametrize("name, inputs, outputs, first_types", [
    ("_proto_only/tiny-bert__tiny-bert-squad.tnnproto",
     [("attention_mask", (1, 256), 3), ("input_ids", (1, 256), 3), ("token_type_ids", (1, 256), 3)],
     ["output_0", "output_1"], None),
    ("_proto_only/youtu_face_alignment__youtu_face_alignment_phase1.tnnproto",
     [("input", (1, 1, 128, 128), 0)], ["852", "855"], ["Convolution", "ReLU", "Convolution"]),
    ("_proto_only/blazeface__blazeface.tnnproto", [("x.1", (1, 3, 128, 128), 0)], ["544", "546"],
     ["Pad", "Convolution", "ReLU"]),
    ("mobilenetv2_quantized/model.quantized.tnnproto", [("input", (1, 3, 224, 224), 0)], ["prob"],
     ["QuantizedConvolution"] * 3),
    ("ultraface_slim320/version-slim-320_simplified.tnnproto", [("input", (1, 3, 240, 320), 0)],
     ["scores", "boxes"], ["Convolution", "ReLU", "Convolution"]),
])
def test_real_proto_details(name, inputs, outputs, first_types):
    p = parse_proto(TNN_MODELS / name)
    assert [(i.name, i.shape, i.dtype_code) for i in p.inputs] == inputs
    assert p.outputs == outputs
    if first_types:
        assert [layer.type for layer in p.layers[:3]] == first_types


# Layer types of the weightless graphs that we parse but cannot run (no canonical counterpart yet).
PARSE_ONLY: set[str] = set()


@pytest.mark.shared
@pytest.mark.skipif(not TNN_MODELS.is_dir(), reason="../shared/models/tnn is not available")
def test_every_layer_type_of_the_real_graphs_has_a_lowering():
    from engine.formats.tnn.lowering.lower import HANDLED_TYPES

    types = {layer.type for path in _real_protos() for layer in parse_proto(path).layers}
    assert types - HANDLED_TYPES == PARSE_ONLY
