"""Fuzzing both TNN readers: mutated and random inputs only ever raise our own errors, fast and small."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import EngineError, ModelFormatError, UnsupportedOpError
from engine.formats.tnn.lowering.lower import lower_tnn
from engine.formats.tnn.reader import build_graph
from engine.formats.tnn.serializer import Serializer
from engine.formats.tnn.tnnmodel import read_model_bytes
from engine.formats.tnn.tnnproto import parse_proto_text

SHARED = Path(__file__).resolve().parents[4].parent / "shared"
TNN_MODELS = SHARED / "models" / "tnn"
FUZZ = settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow])

PROTO = '''"1 4 1 4206624772 ,"
"x 4 1 3 8 8 0 : ids 2 1 4 3 ,"
" x c r ,"
"r k ,"
" 3 ,"
"Convolution c 1 1 x c 1 3 4 3 3 1 1 1 1 1 -1 1 1 0 ,"
"ReLU r 1 1 c r ,"
"Gather k 1 1 ids k 0 1 0 ,"
'''


def _model() -> bytes:
    s = Serializer(2)
    s.u32(s.magic), s.i32(2)
    s.i32(1), s.string("Convolution"), s.string("c"), s.string("c"), s.i32(1)
    s.raw(np.ones((4, 3, 3, 3), np.float32), fp16=True), s.raw(np.zeros(4, np.float32))
    s.i32(104), s.string("Gather"), s.string("k"), s.i32(1), s.raw(np.ones((10, 2), np.float32)), s.i32(0)
    s.u32(s.magic), s.i32(1), s.string("w"), s.raw(np.arange(6, dtype=np.int32).reshape(2, 3))
    return s.getvalue()


MODEL = _model()


def _mutate(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    buf = bytearray(data)
    for pos, byte in edits:
        buf[pos % len(buf)] = byte
    return bytes(buf[:cut] if cut is not None else buf)


def _read_bounded(data: bytes) -> None:
    tracemalloc.start()
    try:
        read_model_bytes(data, "fuzz.tnnmodel")
    except ModelFormatError as e:
        assert e.offset is not None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    # half data widens to twice its size; nothing may allocate beyond what the file could hold
    assert peak < 3 * len(data) + 256 * 1024


def _assert_located(e: EngineError) -> None:
    """A reader's error: a format error naming a line or byte offset, or an unsupported layer with file:line."""
    if isinstance(e, UnsupportedOpError):
        assert "fuzz.tnnproto:" in str(e), e
    else:
        assert isinstance(e, ModelFormatError) and (e.line is not None or e.offset is not None), e


edits = st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=8)


@FUZZ
@given(edits, st.one_of(st.none(), st.integers(0, len(MODEL))))
def test_mutated_model_bytes(edit_list, cut):
    _read_bounded(_mutate(MODEL, edit_list, cut))


@FUZZ
@given(st.binary(max_size=512))
def test_random_model_bytes(data):
    _read_bounded(data)


@FUZZ
@given(st.binary(max_size=64))
def test_model_with_random_tail(tail):
    _read_bounded(MODEL[:40] + tail)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 1 << 16), st.sampled_from(list(' ,":\n\r0123456789-xq\x00é'))),
                max_size=6), st.one_of(st.none(), st.integers(0, len(PROTO))))
def test_mutated_proto_text(edit_list, cut):
    chars = list(PROTO)
    for pos, ch in edit_list:
        chars[pos % len(chars)] = ch
    text = "".join(chars)[:cut]
    try:
        proto = parse_proto_text(text, "fuzz.tnnproto")
        build_graph(proto, read_model_bytes(MODEL))
    except EngineError as e:
        _assert_located(e)


@FUZZ
@given(st.text(max_size=300))
def test_random_proto_text(text):
    try:
        parse_proto_text(text, "fuzz.tnnproto")
    except EngineError as e:
        _assert_located(e)


@pytest.mark.shared
@pytest.mark.skipif(not TNN_MODELS.is_dir(), reason="../shared/models/tnn is not available")
@settings(max_examples=60, deadline=5000, suppress_health_check=[HealthCheck.too_slow])
@given(edits, st.one_of(st.none(), st.integers(0, 1 << 20)))
def test_mutated_real_model(edit_list, cut):
    data = (TNN_MODELS / "ultraface_slim320" / "version-slim-320_simplified.tnnmodel").read_bytes()
    # Edits land in the first 64 KiB, where the headers and lengths are.
    _read_bounded(_mutate(data, [(p % 65536, b) for p, b in edit_list], cut))


FIXTURE = Path(__file__).resolve().parents[3] / "fixtures" / "tnn" / "misc_conv_resize_v1"


@pytest.mark.slow
@settings(max_examples=int(os.environ.get("TNN_FUZZ_EXAMPLES", "20")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(-3, 40)), min_size=1, max_size=3))
def test_mutated_layer_parameters_fail_as_engine_errors(tmp_path_factory, edits):
    import engine

    lines = (FIXTURE / "model.tnnproto").read_text().splitlines()
    header, layers = lines[:5], lines[5:]
    tokens = [(i, j) for i, line in enumerate(layers) for j, tok in enumerate(line.split()) if j >= 4]
    for pos, value in edits:  # small values keep every shape (and so every allocation) small
        i, j = tokens[pos % len(tokens)]
        parts = layers[i].split()
        parts[j] = str(value)
        layers[i] = " ".join(parts)
    work = tmp_path_factory.mktemp("mut")
    (work / "model.tnnproto").write_text("\n".join(header + layers) + "\n")
    (work / "model.tnnmodel").write_bytes((FIXTURE / "model.tnnmodel").read_bytes())
    x = dict(np.load(FIXTURE / "inputs.npz"))
    try:
        engine.load(work / "model.tnnproto").instance().run(x)
    except EngineError:
        pass


@pytest.mark.shared
@pytest.mark.skipif(not TNN_MODELS.is_dir(), reason="../shared/models/tnn is not available")
@settings(max_examples=60, deadline=5000, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 1 << 16), st.sampled_from(list(' ,":\n0123456789-xQ'))), max_size=6),
       st.one_of(st.none(), st.integers(0, 1 << 14)))
def test_mutated_real_proto(edit_list, cut):
    proto = TNN_MODELS / "ultraface_slim320" / "version-slim-320_simplified.tnnproto"
    chars = list(proto.read_text())
    for pos, ch in edit_list:
        chars[pos % len(chars)] = ch
    model = read_model_bytes((TNN_MODELS / "ultraface_slim320" / "version-slim-320_simplified.tnnmodel").read_bytes())
    try:  # reading and lowering (which checks every layer's parameters against its weights)
        lower_tnn(build_graph(parse_proto_text("".join(chars)[:cut], "fuzz.tnnproto"), model))
    except EngineError:
        pass
