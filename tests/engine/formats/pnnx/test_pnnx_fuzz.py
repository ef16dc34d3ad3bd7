"""Fuzzing the pnnx reader: mutated param texts and weight archives only ever raise ModelFormatError, quickly."""

from __future__ import annotations

import re
import time

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import ModelFormatError
from engine.formats.pnnx.reader import load_graph
from engine.formats.pnnx.writer import write_pnnx

TEXT = """7767517
7 7
pnnx.Input               pnnx_input_0             0 1 0 #0=(1,3,?,?)f32
pnnx.Attribute           scale                    0 1 1 @data=(1,3,1,1)f32 #1=(1,3,1,1)f32
nn.Conv2d                conv                     1 1 0 2 bias=True dilation=(1,1) groups=1 in_channels=3 kernel_size=(1,1) out_channels=3 padding=same padding_mode=zeros stride=(1,1) @bias=(3)f32 @weight=(3,3,1,1)f32 $input=0 #0=(1,3,?,?)f32 #2=(1,3,?,?)f32
pnnx.Expression          pnnx_expr_0              2 1 2 1 3 expr=mul(@0,@1) #2=(1,3,?,?)f32 #1=(1,3,1,1)f32 #3=(1,3,?,?)f32
pnnx.Expression          pnnx_expr_1              1 1 0 4 expr=[size(@0,2),size(@0,3)] #0=(1,3,?,?)f32
prim::TupleConstruct     pnnx_9                   2 1 3 4 5
pnnx.Output              pnnx_output_0            1 0 5
"""  # noqa: E501
WEIGHTS = {"scale.data": np.ones((1, 3, 1, 1), np.float32), "conv.bias": np.zeros(3, np.float32),
           "conv.weight": np.ones((3, 3, 1, 1), np.float32)}
FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.function_scoped_fixture])
ALPHABET = "0123456789()[],=@$#?.-_ \nfxiTpnN"


def _load_quietly(path) -> None:
    start = time.perf_counter()
    try:
        load_graph(path)
    except ModelFormatError as e:  # naming the param or bin file, and a line or byte offset
        assert e.path in (str(path), str(path.with_name("m.pnnx.bin"))), e
        assert e.line is not None or e.offset is not None or re.search(rf"{path.name}:\d+", str(e)), e
    assert time.perf_counter() - start < 1.0


def test_the_unmutated_model_loads(tmp_path):
    g = load_graph(write_pnnx(tmp_path / "m.pnnx.param", TEXT, WEIGHTS))
    assert len(g.outputs) == 2 and len(g.nodes) == 3


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, len(TEXT) - 1), st.sampled_from(ALPHABET)), min_size=1,
                      max_size=6),
       cut=st.none() | st.integers(0, len(TEXT)))
def test_mutated_param_text(tmp_path_factory, edits, cut):
    chars = list(TEXT)
    for pos, ch in edits:
        chars[pos] = ch
    text = "".join(chars)[:cut]
    path = write_pnnx(tmp_path_factory.mktemp("p") / "m.pnnx.param", text, WEIGHTS)
    _load_quietly(path)


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8),
       cut=st.none() | st.integers(0, 2000))
def test_mutated_weight_archive(tmp_path_factory, edits, cut):
    path = write_pnnx(tmp_path_factory.mktemp("b") / "m.pnnx.param", TEXT, WEIGHTS)
    bin_path = path.with_name("m.pnnx.bin")
    data = bytearray(bin_path.read_bytes())
    for pos, byte in edits:
        data[pos % len(data)] = byte
    bin_path.write_bytes(bytes(data[:cut] if cut is not None else data))
    _load_quietly(path)
