"""How the readers hold what they read: every weight in an aligned, read-only array of its own, no file left
open, and files that are not regular files (a FIFO, a directory) or change while they are read refused with
ModelFormatError, never a hang or a short array."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from engine.errors import ModelFormatError
from engine.formats import model_files
from engine.formats.model_files import open_model_file, read_float32
from engine.formats.pnnx.reader import load_graph as load_pnnx
from engine.formats.pnnx.writer import write_pnnx
from engine.formats.pnnx.zip_archive import StoredZip
from engine.formats.tnn import tnnmodel
from engine.formats.tnn.reader import load_graph as load_tnn
from engine.formats.tnn.serializer import Serializer
from engine.formats.tnn.tnnmodel import read_model
from engine.ir.const_arrays import ALIGNMENT, aligned_empty, frozen, is_frozen

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PARAM = """7767517
3 3
pnnx.Input               in                       0 1 0 #0=(1,4)f32
pnnx.Attribute           w                        0 1 1 @data=(3,5)f32 #1=(3,5)f32
pnnx.Output              out                      2 0 0 1
"""


def open_fds_under(folder: Path) -> list[str]:
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue  # the listing's own fd, closed by now
    return [link for link in links if link.startswith(str(folder))]


@pytest.mark.parametrize("shape", [(), (0,), (1,), (3, 5), (7, 1, 3)])
@pytest.mark.parametrize("dtype", [np.int8, np.float16, np.float32, np.int64])
def test_aligned_empty(shape, dtype):
    for _ in range(4):  # several allocations: numpy's own alignment varies between them
        a = aligned_empty(shape, np.dtype(dtype))
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous
        assert a.size == 0 or a.ctypes.data % ALIGNMENT == 0


def test_frozen_copies_only_what_is_not_frozen():
    base = np.arange(65, dtype=np.float32)
    view = base[1:]  # 4 bytes past an allocation: not 64-byte aligned
    out = frozen(view)
    assert is_frozen(out) and out is not view and np.array_equal(out, view) and view.flags.writeable
    assert frozen(out) is out


@pytest.mark.parametrize("count", [0, 1, 5, model_files._CHUNK + 3])  # the last one spans two chunks
def test_widening_reads_are_exact_and_frozen(tmp_path, count):
    rng = np.random.default_rng(count)
    half = rng.standard_normal(count).astype(np.float16)
    bf16 = rng.integers(0, 1 << 16, count, dtype=np.uint16)
    path = tmp_path / "w"
    path.write_bytes(b"pad" + half.tobytes() + bf16.tobytes())
    with open_model_file(path, "cannot read") as f:
        f.seek(3)
        got_half = read_float32(f, str(path), 3, (count,), "half", bfloat16=False)
        got_bf16 = read_float32(f, str(path), 3 + 2 * count, (count,), "bf16", bfloat16=True)
    assert is_frozen(got_half) and is_frozen(got_bf16)
    np.testing.assert_array_equal(got_half, half.astype(np.float32))
    np.testing.assert_array_equal(got_bf16.view(np.uint32), bf16.astype(np.uint32) << 16)


def test_pnnx_weights_are_owned_and_the_archive_closed(tmp_path):
    w = np.arange(15, dtype=np.float32).reshape(3, 5)
    path = write_pnnx(tmp_path / "m.pnnx.param", PARAM, {"w.data": w})
    g = load_pnnx(path)
    data = g.outputs[1].const
    assert is_frozen(data) and np.array_equal(data, w)
    assert open_fds_under(tmp_path) == []
    path.with_name("m.pnnx.bin").write_bytes(b"")  # the loaded graph does not notice
    assert np.array_equal(data, w)


def test_pnnx_archive_truncated_while_it_is_read(tmp_path):
    path = write_pnnx(tmp_path / "m.pnnx.param", PARAM, {"w.data": np.ones((3, 5), np.float32)})
    bin_path = path.with_name("m.pnnx.bin")
    with StoredZip(bin_path) as zf:
        offset = bin_path.read_bytes().index(np.ones(1, np.float32).tobytes())
        os.truncate(bin_path, offset + 8)  # after the directory was read, before the entry is
        with pytest.raises(ModelFormatError, match="changed while loading") as e:
            zf.array("w.data", np.dtype(np.float32), (3, 5))
    assert e.value.path == str(bin_path) and e.value.offset == offset + 8


def test_tnn_buffers_are_owned_aligned_and_read_only(tmp_path):
    s = Serializer(2)
    s.u32(s.magic), s.i32(2)
    s.i32(1), s.string("Convolution"), s.string("c"), s.string("c"), s.i32(1)
    s.raw(np.ones((4, 3, 3, 3), np.float32), fp16=True), s.raw(np.arange(4, dtype=np.float32))
    s.i32(0), s.string("Add"), s.string("a"), s.raw(np.arange(3, dtype=np.int8))
    s.u32(s.magic), s.i32(1), s.string("k"), s.raw(np.arange(6, dtype=np.int32).reshape(2, 3))
    path = tmp_path / "m.tnnmodel"
    path.write_bytes(s.getvalue())
    m = read_model(path)
    arrays = [f.data for r in m.resources.values() for f in r.fields.values() if hasattr(f, "data")]
    arrays += [c.data for c in m.consts.values()]
    assert len(arrays) == 4 and all(is_frozen(a) for a in arrays)
    assert m.resources["c"].fields["filter"].data.dtype == np.float32  # fp16 widened
    assert open_fds_under(tmp_path) == []


def test_tnn_model_truncated_while_it_is_read(tmp_path, monkeypatch):
    """The reader checks every size against the file's size at open; a file cut shorter afterwards (the size
    seen at open is made larger here, which is the same race) fails at the first read that comes up short."""
    data = (FIXTURES / "tnn" / "misc_conv_resize_v1" / "model.tnnmodel").read_bytes()
    path = tmp_path / "model.tnnmodel"
    path.write_bytes(data)
    monkeypatch.setattr(tnnmodel, "file_size", lambda f: 2 * len(data))
    with pytest.raises(ModelFormatError, match="changed while loading") as e:
        read_model(path)
    assert e.value.path == str(path) and e.value.offset == len(data)


@pytest.mark.parametrize("kind", ["pnnx_param", "pnnx_bin", "tnnproto", "tnnmodel"])
@pytest.mark.parametrize("special", ["fifo", "directory"])
def test_special_files_are_refused_not_waited_on(tmp_path, kind, special):
    if kind.startswith("pnnx"):
        graph_file = write_pnnx(tmp_path / "m.pnnx.param", PARAM, {"w.data": np.ones((3, 5), np.float32)})
        load = load_pnnx
        target = graph_file if kind == "pnnx_param" else graph_file.with_name("m.pnnx.bin")
    else:
        for f in (FIXTURES / "tnn" / "misc_conv_resize_v1").glob("model.*"):
            (tmp_path / f.name).write_bytes(f.read_bytes())
        graph_file, load = tmp_path / "model.tnnproto", load_tnn
        target = graph_file if kind == "tnnproto" else tmp_path / "model.tnnmodel"
    target.unlink()
    if special == "fifo":
        os.mkfifo(target)  # opening it for reading the usual way would wait for a writer forever
    else:
        target.mkdir()
    with pytest.raises(ModelFormatError, match="not a regular file") as e:
        load(graph_file)
    assert e.value.path == str(target)
