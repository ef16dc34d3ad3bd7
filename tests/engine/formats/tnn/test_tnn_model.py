"""The .tnnmodel reader: buffer encodings, resource bodies, the constant map, and corrupted files."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from engine.errors import ModelFormatError
from engine.formats.registry import FORMATS
from engine.formats.tnn.reader import load_graph
from engine.formats.tnn.serializer import Serializer
from engine.formats.tnn.tnnmodel import read_model, read_model_bytes

SHARED = Path(__file__).resolve().parents[4].parent / "shared"
TNN_MODELS = SHARED / "models" / "tnn"
shared_only = pytest.mark.skipif(not TNN_MODELS.is_dir(), reason="../shared/models/tnn is not available")

PROTO = '''"1 3 1 {magic} ,"
"data {input} ,"
" ,"
"out ,"
" 3 ,"
"Convolution conv 1 1 data c 1 3 4 3 3 1 1 1 1 1 -1 1 1 ,"
"BatchNormCxx bn 1 1 c b ,"
"Add add 2 1 b k out -1 ,"
'''
RNG = np.random.default_rng(7)
W = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
B = RNG.standard_normal(4).astype(np.float32)
K = np.arange(4, dtype=np.float32).reshape(1, 4, 1, 1)


def model_bytes(version: int = 2, *, fp16: bool = False, with_magic: bool = True, const_map: bool = True) -> bytes:
    s = Serializer(version)
    if with_magic:
        s.u32(s.magic)
    s.i32(2)
    s.i32(1), s.string("Convolution"), s.string("conv"), s.string("conv"), s.i32(1)
    s.raw(W, fp16=fp16), s.raw(B, fp16=fp16)
    s.i32(2), s.string("BatchNormCxx"), s.string("bn")
    s.raw(np.full(4, 2, np.float32)), s.raw(None)  # BN with an empty bias buffer
    if const_map:
        s.u32(s.magic), s.i32(1), s.string("k"), s.raw(K)
    return s.getvalue()


def write_model(tmp_path: Path, data: bytes, version: int = 2) -> Path:
    proto = PROTO.format(magic=4206624772 if version == 2 else 4206624770,
                         input="4 1 3 8 8 0" if version == 2 else "1 3 8 8")
    (tmp_path / "m.tnnproto").write_text(proto)
    (tmp_path / "m.tnnmodel").write_bytes(data)
    return tmp_path / "m.tnnproto"


def test_v2_buffers_carry_dims_and_constants():
    m = read_model_bytes(model_bytes(2))
    conv = m.resources["conv"]
    assert conv.type == "Convolution" and conv.fields["has_bias"] == 1
    np.testing.assert_array_equal(conv.fields["filter"].data, W)
    assert conv.fields["filter"].dims == (4, 3, 3, 3)
    assert m.resources["bn"].fields["bias"].data.size == 0
    np.testing.assert_array_equal(m.consts["k"].data, K)


def test_v1_buffers_are_flat_and_magic_is_optional():
    for with_magic in (True, False):
        m = read_model_bytes(model_bytes(1, with_magic=with_magic, const_map=False))
        f = m.resources["conv"].fields["filter"]
        assert f.dims is None
        np.testing.assert_array_equal(f.data, W.ravel())


def test_arrays_are_views_over_the_file_bytes():
    data = model_bytes(2)
    f = read_model_bytes(data).resources["conv"].fields["filter"].data
    assert not f.flags.owndata and f.base is not None


def test_half_weights_are_widened_exactly():
    m = read_model_bytes(model_bytes(2, fp16=True))
    f = m.resources["conv"].fields["filter"]
    assert f.code == 1 and f.data.dtype == np.float32
    np.testing.assert_array_equal(f.data, W.astype(np.float16).astype(np.float32))


def test_int8_filter_with_zero_point_and_scale_or_old_float_scale():
    for new_style in (True, False):
        s = Serializer(2)
        s.u32(s.magic), s.i32(1), s.i32(1), s.string("Convolution"), s.string("q"), s.string("q"), s.i32(1)
        s.raw(np.arange(8, dtype=np.int8).reshape(2, 4, 1, 1)), s.raw(np.array([5, -5], np.int32))
        if new_style:
            s.raw(np.zeros(2, np.int8))
        s.raw(np.array([0.5, 0.25], np.float32))
        res = read_model_bytes(s.getvalue()).resources["q"].fields
        assert res["filter"].data.dtype == np.int8 and res["bias"].data.dtype == np.int32
        np.testing.assert_array_equal(res["scale"].data, [0.5, 0.25])
        assert ("zero_point" in res) == new_style


def test_blob_scales_and_bfloat16():
    s = Serializer(2)
    s.u32(s.magic), s.i32(1), s.i32(600), s.string("BlobScale"), s.string("data_scale_data_")
    s.raw(np.zeros(1, np.int8)), s.raw(np.array([0.03], np.float32)), s.raw(np.zeros(1, np.int32))
    s.u32(s.magic), s.i32(1), s.string("bf")
    s.raw(np.array([0x3F80, 0xC000], np.uint16), code=4)
    m = read_model_bytes(s.getvalue())
    np.testing.assert_array_equal(m.blob_scales["data"].fields["scale"].data, np.float32([0.03]))
    np.testing.assert_array_equal(m.consts["bf"].data, [1.0, -2.0])


def test_load_graph_attaches_resources_and_consts(tmp_path):
    g = load_graph(write_model(tmp_path, model_bytes(2)))
    conv, bn, add = g.nodes
    np.testing.assert_array_equal(conv.attrs["filter"], W)
    assert conv.params["resource"]["has_bias"] == 1 and conv.params["resource_types"]["filter"] == 0
    assert add.inputs[1].is_const and add.inputs[1].name == "k"
    g.validate()


def test_resource_for_unknown_layer_names_offset(tmp_path):
    data = model_bytes(2).replace(b"\x02\x00\x00\x00bn", b"\x02\x00\x00\x00zz")
    with pytest.raises(ModelFormatError, match="'zz'") as e:
        load_graph(write_model(tmp_path, data))
    assert e.value.offset == model_bytes(2).index(b"BatchNormCxx") - 8  # at its type int


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d[:4] + b"\xff\xff\xff\x0f" + d[8:], "resource count"),
    (lambda d: _set_filter_field(d, 8, 0x7FFFFFF0), "needs 2147483632 bytes"),
    (lambda d: _set_filter_field(d, 8, 7), "not a multiple"),
    (lambda d: _set_filter_field(d, 4, 99), "data type code 99"),
    (lambda d: _bad_buffer_magic(d), "buffer magic"),
    (lambda d: _set_dims_count(d, 1000), "dims count"),
    (lambda d: _set_dims_count(d, 3), "do not match"),
    (lambda d: d + b"junk", "unexpected bytes"),
    (lambda d: d[:-3], "truncated|unexpected"),
])
def test_corruptions_raise_format_errors_with_offsets(mutate, needle):
    with pytest.raises(ModelFormatError, match=needle) as e:
        read_model_bytes(mutate(model_bytes(2)), "m.tnnmodel")
    assert e.value.offset is not None and "m.tnnmodel at byte" in str(e.value)


def _filter_offset(d: bytes) -> int:
    return d.index(b"conv", d.index(b"conv") + 4) + 8  # after name_again and has_bias


def _bad_buffer_magic(d: bytes) -> bytes:
    at = _filter_offset(d)
    return d[:at] + b"\x00\x00\x00\x00" + d[at + 4:]


def _set_filter_field(d: bytes, field: int, n: int) -> bytes:
    at = _filter_offset(d) + field
    return d[:at] + n.to_bytes(4, "little") + d[at + 4:]


def _set_dims_count(d: bytes, n: int) -> bytes:
    return _set_filter_field(d, 12, n)


def test_every_truncation_is_a_format_error():
    data = model_bytes(2)
    const_map_start = len(model_bytes(2, const_map=False))
    for cut in range(len(data)):
        if cut == const_map_start:  # the constant map is optional: this prefix is a valid file
            assert read_model_bytes(data[:cut]).consts == {}
            continue
        with pytest.raises(ModelFormatError):
            read_model_bytes(data[:cut])


def test_huge_declared_sizes_allocate_nothing():
    data = bytearray(model_bytes(2))
    at = _filter_offset(bytes(data)) + 8  # byte length of the filter buffer
    data[at:at + 4] = (0x7FFFFFF0).to_bytes(4, "little")
    tracemalloc.start()
    t = time.perf_counter()
    with pytest.raises(ModelFormatError):
        read_model_bytes(bytes(data))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 * 1024 and time.perf_counter() - t < 1


# -- real files -------------------------------------------------------------------------------------------------
def _real_models() -> list[Path]:
    return sorted(p for p in TNN_MODELS.glob("**/*.tnnmodel")) if TNN_MODELS.is_dir() else []


@pytest.mark.shared
@shared_only
@pytest.mark.parametrize("path", _real_models(), ids=lambda p: p.name)
def test_real_models_read_to_the_last_byte(path):
    m = read_model(path)  # the reader rejects trailing bytes, so this consumed the whole file
    assert m.resources
    g = load_graph(path.with_name(path.name.replace(".tnnmodel", ".tnnproto")))
    g.validate()
    with_res = [n for n in g.nodes if n.attrs]
    assert len(with_res) == len(m.resources)


@pytest.mark.shared
@shared_only
def test_real_quantized_model_keeps_int8_and_blob_scales():
    m = read_model(TNN_MODELS / "mobilenetv2_quantized" / "model.quantized.tnnmodel")
    conv1 = m.resources["conv1"]
    assert conv1.type == "Convolution"
    assert conv1.fields["filter"].data.dtype == np.int8 and conv1.fields["bias"].data.dtype == np.int32
    assert conv1.fields["scale"].data.shape == (32,)
    assert "input" in m.blob_scales and "fc7" in m.blob_scales
    assert m.blob_scales["relu1"].fields["scale"].data.shape == (32,)  # per channel


@pytest.mark.shared
@shared_only
def test_real_fp16_model_stores_half():
    m = read_model(TNN_MODELS / "converted" / "mobilenet_v2_fp16" / "mobilenet_v2_fp16.tnnmodel")
    codes = {r.fields["filter"].code for r in m.resources.values() if "filter" in r.fields}
    assert codes == {1}


@pytest.mark.shared
@shared_only
@pytest.mark.parametrize("name", ["ultraface_slim320/version-slim-320_simplified.tnnmodel",
                                  "converted/misc_transformer/misc_transformer.tnnmodel"])
def test_real_model_truncations_fail_cleanly(name):
    data = (TNN_MODELS / name).read_bytes()
    for cut in np.random.default_rng(0).integers(0, len(data), 40):
        with pytest.raises(ModelFormatError):
            read_model_bytes(data[:cut])


@pytest.mark.parametrize("stored", [1, 0], ids=["one-shared-scale", "no-bias"])
def test_values_spread_over_a_huge_declared_channel_count_are_refused(tmp_path, stored):
    """A BatchNormCxx whose scale is stored once for every channel (or whose bias is not stored), over an input the
    file declares with 2**31 - 1 channels: refused at load, naming the layer, not spread over an 8 GiB array."""
    proto = ('"1 1 1 4206624772 ,"\n"data 4 1 2147483647 8 8 0 ,"\n" ,"\n"out ,"\n" 1 ,"\n'
             '"BatchNormCxx bn 1 1 data out ,"\n')
    s = Serializer(2)
    s.u32(s.magic), s.i32(1)
    s.i32(2), s.string("BatchNormCxx"), s.string("bn")
    s.raw(np.full(stored, 2, np.float32) if stored else None), s.raw(None)
    (tmp_path / "m.tnnproto").write_text(proto)
    (tmp_path / "m.tnnmodel").write_bytes(s.getvalue())
    tracemalloc.start()
    try:
        with pytest.raises(ModelFormatError, match=r"'bn'.*2147483647 channels"):
            FORMATS["tnn"].lower(load_graph(tmp_path / "m.tnnproto"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak
