"""The `.pnnx.bin` weights archive: a zip whose entries are all stored (uncompressed), usually in zip64 form.

The reader reads the central directory once, then each entry straight into an aligned array of its own (see
engine/formats/model_files.py): the loaded model keeps no handle on the file and does not change when it does.
Every header field is bounds-checked against the file size before use: a lying header raises ModelFormatError
with the byte offset, never a huge allocation or a read past the end. Call `close()` (or use `with`) when done.
The writer (Python's zipfile with ZIP_STORED) exists for tests and tools that build small models.
"""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from engine.errors import ModelFormatError
from engine.formats.model_files import file_size, open_model_file, read_array, read_exact, read_float32

_EOCD = struct.Struct("<4sHHHHIIH")  # end of central directory, 22 bytes
_LOC64 = struct.Struct("<4sIQI")  # zip64 end-of-central-directory locator, 20 bytes
_EOCD64 = struct.Struct("<4sQHHIIQQQQ")  # zip64 end of central directory, 56 bytes
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")  # central directory header, 46 bytes
_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # local file header, 30 bytes
_MAX_COMMENT = 0xFFFF


class StoredZip:
    """Read-only access to a stored zip: `array(name, dtype, shape)` reads one entry into an array of its own."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._file = open_model_file(path, "cannot read weights file")
        # name -> (offset of the central directory record, local header offset, stored size, method, flags)
        self._entries: dict[str, tuple[int, int, int, int, int]] = {}
        try:
            self.size = file_size(self._file)
            if self.size == 0:
                raise ModelFormatError(self.path, "empty file, expected a zip archive", offset=0)
            self._read_central_directory()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> StoredZip:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- parsing --------------------------------------------------------------------------------------
    def _fail(self, msg: str, offset: int) -> ModelFormatError:
        return ModelFormatError(self.path, msg, offset=offset)

    def _read(self, offset: int, n: int, what: str) -> bytearray:
        """`n` bytes at `offset`, which the caller has checked lie within the file."""
        buf = bytearray(n)
        self._file.seek(offset)
        read_exact(self._file, memoryview(buf), self.path, offset, what)
        return buf

    def _unpack(self, st: struct.Struct, offset: int, what: str) -> tuple:
        if offset < 0 or offset + st.size > self.size:
            raise self._fail(f"{what} at byte {offset} runs past the end of the file ({self.size} bytes)", offset)
        return st.unpack(self._read(offset, st.size, what))

    def _read_central_directory(self) -> None:
        lo = max(0, self.size - _EOCD.size - _MAX_COMMENT)
        pos = self._read(lo, self.size - lo, "end of the file").rfind(b"PK\x05\x06")
        pos = -1 if pos < 0 else lo + pos
        if pos < 0 or pos + _EOCD.size > self.size:
            raise self._fail("not a zip archive (no end-of-central-directory record)", self.size)
        _, _, _, _, count, cd_size, cd_offset, _ = self._unpack(_EOCD, pos, "end of central directory")
        if count == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:
            count, cd_size, cd_offset = self._read_zip64_end(pos)
        if cd_offset + cd_size > self.size:
            raise self._fail(f"central directory ({cd_size} bytes at {cd_offset}) runs past the end", cd_offset)
        if count * _CENTRAL.size > cd_size:
            raise self._fail(f"central directory claims {count} entries in {cd_size} bytes", cd_offset)
        directory = _Block(self._read(cd_offset, cd_size, "central directory"), cd_offset, self.path)
        offset = cd_offset
        for _ in range(count):
            offset = self._read_central_entry(directory, offset)

    def _read_zip64_end(self, eocd_pos: int) -> tuple[int, int, int]:
        sig, _, eocd64_pos, _ = self._unpack(_LOC64, eocd_pos - _LOC64.size, "zip64 locator")
        if sig != b"PK\x06\x07":
            raise self._fail("zip64 locator missing before the end-of-central-directory record", eocd_pos - 20)
        rec = self._unpack(_EOCD64, eocd64_pos, "zip64 end of central directory")
        if rec[0] != b"PK\x06\x06":
            raise self._fail("bad zip64 end-of-central-directory signature", eocd64_pos)
        return rec[7], rec[8], rec[9]

    def _read_central_entry(self, cd: _Block, offset: int) -> int:
        rec = cd.unpack(_CENTRAL, offset, "central directory entry")
        sig, _, _, flags, method, _, _, _, csize, usize, name_len, extra_len, comment_len, _, _, _, local = rec
        if sig != b"PK\x01\x02":
            raise self._fail("bad central directory entry signature", offset)
        name_at = offset + _CENTRAL.size
        nxt = name_at + name_len + extra_len + comment_len
        if nxt > cd.end:
            raise self._fail("central directory entry runs past the directory", offset)
        raw_name = cd.bytes(name_at, name_len)
        name = raw_name.decode("utf-8" if flags & 0x800 else "cp437", errors="replace")
        csize, usize, local = self._zip64_extra(cd, name_at + name_len, extra_len, csize, usize, local)
        if csize != usize and method == 0:
            raise self._fail(f"entry {name!r}: stored entry with different sizes {csize} != {usize}", offset)
        self._entries[name] = (offset, local, csize, method, flags)
        return nxt

    def _zip64_extra(self, cd: _Block, at: int, length: int, csize: int, usize: int,
                     local: int) -> tuple[int, int, int]:
        """Replaces the 0xFFFFFFFF fields with the values from the zip64 extra field (id 1), in zip order."""
        end = at + length
        while at + 4 <= end:
            tag, size = cd.unpack(_EXTRA, at, "extra field")
            body, at = at + 4, at + 4 + size
            if at > end:
                raise self._fail("extra field runs past its entry", body - 4)
            if tag != 1:
                continue
            fields = [f for f in ("usize", "csize", "local") if {"usize": usize, "csize": csize,
                                                                  "local": local}[f] == 0xFFFFFFFF]
            if 8 * len(fields) > size:
                raise self._fail("zip64 extra field too short", body)
            vals = dict(zip(fields, cd.unpack(struct.Struct(f"<{len(fields)}Q"), body, "zip64 extra field"),
                            strict=True))
            usize, csize, local = vals.get("usize", usize), vals.get("csize", csize), vals.get("local", local)
        return csize, usize, local

    # -- access ---------------------------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def entry_span(self, name: str) -> tuple[int, int]:
        """(byte offset, byte count) of the stored data of `name` in the file, checked to lie within it."""
        if name not in self._entries:
            raise ModelFormatError(self.path, f"missing zip entry {name!r}")
        central, local, size, method, flags = self._entries[name]
        if method != 0:
            raise self._fail(f"entry {name!r} is compressed (method {method}); pnnx weights must be stored",
                             central)
        if flags & 0x1:
            raise self._fail(f"entry {name!r} is encrypted", central)
        sig, _, _, lmethod, _, _, _, _, _, name_len, extra_len = self._unpack(_LOCAL, local, "local header")
        if sig != b"PK\x03\x04":
            raise self._fail(f"entry {name!r}: bad local header signature", local)
        if lmethod != 0:
            raise self._fail(f"entry {name!r} is compressed (method {lmethod})", local)
        data = local + _LOCAL.size + name_len + extra_len
        if data + size > self.size:
            raise self._fail(f"entry {name!r}: {size} bytes at {data} run past the end of the file", data)
        return data, size

    def array(self, name: str, dtype: np.dtype, shape: tuple[int, ...], *, bfloat16: bool = False) -> np.ndarray:
        """The entry as a read-only aligned array of its own; it must hold exactly prod(shape) elements.
        `bfloat16`: the entry holds bfloat16 values (`dtype` is then ignored), widened to float32."""
        offset, size = self.entry_span(name)
        stored = np.dtype(np.uint16) if bfloat16 else np.dtype(dtype)
        count = 1
        for d in shape:
            count *= d
        want = count * stored.itemsize
        if size != want:
            raise self._fail(f"entry {name!r} holds {size} bytes, expected {want} for shape "
                             f"{tuple(shape)} {'bfloat16' if bfloat16 else stored.name}", offset)
        self._file.seek(offset)
        what = f"entry {name!r}"
        if bfloat16:
            return read_float32(self._file, self.path, offset, tuple(shape), what, bfloat16=True)
        return read_array(self._file, self.path, offset, stored.newbyteorder("<"), tuple(shape), what)


_EXTRA = struct.Struct("<HH")  # extra field header: tag, size


class _Block:
    """Bytes read from the file at `base`; offsets are the file's, checked against the block's end."""

    def __init__(self, data: bytearray, base: int, path: str):
        self.data, self.base, self.end, self.path = data, base, base + len(data), path

    def unpack(self, st: struct.Struct, offset: int, what: str) -> tuple:
        if offset + st.size > self.end:
            raise ModelFormatError(self.path, f"{what} at byte {offset} runs past the central directory",
                                   offset=offset)
        return st.unpack_from(self.data, offset - self.base)

    def bytes(self, offset: int, n: int) -> bytes:
        return bytes(self.data[offset - self.base : offset - self.base + n])


def write_stored_zip(path: str | Path, entries: Mapping[str, bytes | np.ndarray]) -> None:
    """Writes `entries` (name -> bytes or array, C order) as an uncompressed zip, like pnnx's writer."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        for name, data in entries.items():
            raw = np.ascontiguousarray(data).tobytes() if isinstance(data, np.ndarray) else bytes(data)
            z.writestr(zipfile.ZipInfo(name), raw)
