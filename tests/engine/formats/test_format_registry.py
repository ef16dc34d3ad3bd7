"""FORMATS: each format's model files, reader and lowering agree with what the format folder itself does, on the
committed fixtures of every format."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.formats.registry import FORMATS, format_of
from engine.runtime.loading import unsupported_nodes

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
EXAMPLES = {"pnnx": FIXTURES / "pnnx" / "convnext", "tnn": FIXTURES / "tnn" / "misc_conv_resize_v1"}


def test_every_format_has_an_example_and_its_repository_files():
    assert set(EXAMPLES) == set(FORMATS)
    assert {n: f.files for n, f in FORMATS.items()} == {"tnn": ("model.tnnproto", "model.tnnmodel"),
                                                        "pnnx": ("model.pnnx.param", "model.pnnx.bin")}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_files_reader_and_lowering_fit_together(name):
    fmt = FORMATS[name]
    graph_file, weights_file = (EXAMPLES[name] / f for f in fmt.files)
    assert graph_file.is_file() and weights_file.is_file()
    assert format_of(graph_file) is fmt and format_of(weights_file) is None
    graph = fmt.read(graph_file)
    assert graph.meta["format"] == name
    types = {n.op_type.split(":", 1)[1] for n in graph.nodes if n.op_type.startswith(f"{name}:")}
    assert types and types <= fmt.lowered_types and not unsupported_nodes(graph)
    lowered = fmt.lower(graph)
    assert not any(n.op_type.startswith(f"{name}:") for n in lowered.nodes)


def test_unknown_suffix_has_no_format():
    assert format_of("model.onnx") is None
    assert format_of("x.tnnmodel") is None
