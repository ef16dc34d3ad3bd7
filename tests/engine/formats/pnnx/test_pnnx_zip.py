"""The stored-zip reader on archives laid out like pnnx's own writer: zip64 everywhere, sizes only in extras."""

from __future__ import annotations

import struct
import zipfile
import zlib

import numpy as np
import pytest

from engine.errors import ModelFormatError
from engine.formats.pnnx.zip_archive import StoredZip


def _pnnx_style_zip(entries: dict[str, bytes]) -> bytes:
    """Mirrors pnnx's StoreZipWriter: version/flags/time 0, 0xFFFFFFFF sizes, a 28-byte zip64 extra per header."""
    out, central = bytearray(), bytearray()
    for name, data in entries.items():
        offset, raw_name, crc = len(out), name.encode(), zlib.crc32(data)
        extra = struct.pack("<HHQQQI", 1, 28, len(data), len(data), offset, 0)
        out += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 0, 0, 0, 0, 0, crc, 0xFFFFFFFF, 0xFFFFFFFF,
                           len(raw_name), len(extra)) + raw_name + extra + data
        central += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 0, 0, 0, 0, 0, 0, crc, 0xFFFFFFFF,
                               0xFFFFFFFF, len(raw_name), len(extra), 0, 0, 0, 0, 0xFFFFFFFF) + raw_name + extra
    cd_offset, n = len(out), len(entries)
    out += central
    eocd64 = len(out)
    out += struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 0, 0, 0, 0, n, n, len(central), cd_offset)
    out += struct.pack("<4sIQI", b"PK\x06\x07", 0, eocd64, 1)
    out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0xFFFF, 0xFFFF, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return bytes(out)


ENTRIES = {"convbn2d_0.weight": np.arange(24, dtype=np.float32).tobytes(),
           "b1.attn.out_proj.bias": np.arange(3, dtype=np.float32).tobytes(), "empty": b""}


def test_pnnx_layout_reads_like_python_zipfile(tmp_path):
    path = tmp_path / "m.pnnx.bin"
    path.write_bytes(_pnnx_style_zip(ENTRIES))
    with zipfile.ZipFile(path) as z:  # the layout is a valid zip
        assert {i.filename: z.read(i) for i in z.infolist()} == ENTRIES
    zf = StoredZip(path)
    assert zf.names() == list(ENTRIES)
    w = zf.array("convbn2d_0.weight", np.dtype(np.float32), (2, 3, 4))
    np.testing.assert_array_equal(w, np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    assert zf.array("b1.attn.out_proj.bias", np.dtype(np.float32), (3,)).tolist() == [0, 1, 2]
    assert zf.array("empty", np.dtype(np.float32), (0,)).shape == (0,)


def test_python_zipfile_stored_archive(tmp_path):
    path = tmp_path / "m.bin"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("a.weight", np.ones(5, np.float16).tobytes())
    assert StoredZip(path).array("a.weight", np.dtype(np.float16), (5,)).tolist() == [1.0] * 5


def test_lying_zip64_directory_offset(tmp_path):
    data = bytearray(_pnnx_style_zip(ENTRIES))
    eocd64 = len(data) - 22 - 20 - 56
    struct.pack_into("<Q", data, eocd64 + 48, 2**40)  # cd_offset far past the end
    path = tmp_path / "m.bin"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match="runs past the end") as e:
        StoredZip(path)
    assert e.value.offset == 2**40


def test_lying_entry_size_and_count(tmp_path):
    data = bytearray(_pnnx_style_zip(ENTRIES))
    first_extra = 30 + len("convbn2d_0.weight")
    cd = data.index(b"PK\x01\x02")
    struct.pack_into("<QQ", data, cd + 46 + len("convbn2d_0.weight") + 4, 2**50, 2**50)
    path = tmp_path / "m.bin"
    path.write_bytes(bytes(data))
    zf = StoredZip(path)
    with pytest.raises(ModelFormatError, match="run past the end") as e:
        zf.entry_span("convbn2d_0.weight")
    assert e.value.offset == first_extra + 32
    eocd64 = len(data) - 22 - 20 - 56
    struct.pack_into("<QQ", data, eocd64 + 24, 10**12, 10**12)  # entry counts
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match="claims"):
        StoredZip(path)
