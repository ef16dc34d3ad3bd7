"""The `.pnnx.bin` weights archive: a zip whose entries are all stored (uncompressed), usually in zip64 form.

The reader maps the file and hands out `np.frombuffer` views at each entry's data offset, so weights are never
copied. Every header field is bounds-checked against the file size before use: a lying header raises
ModelFormatError with the byte offset, never a huge allocation or a read past the end.
The writer (Python's zipfile with ZIP_STORED) exists for tests and tools that build small models.
"""

from __future__ import annotations

import mmap
import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from engine.errors import ModelFormatError

_EOCD = struct.Struct("<4sHHHHIIH")  # end of central directory, 22 bytes
_LOC64 = struct.Struct("<4sIQI")  # zip64 end-of-central-directory locator, 20 bytes
_EOCD64 = struct.Struct("<4sQHHIIQQQQ")  # zip64 end of central directory, 56 bytes
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")  # central directory header, 46 bytes
_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # local file header, 30 bytes
_MAX_COMMENT = 0xFFFF


class StoredZip:
    """Read-only view of a stored zip. `entry_bytes(name)` is a memoryview slice of the mapped file."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        try:
            with open(path, "rb") as f:
                f.seek(0, 2)
                self.size = f.tell()
                if self.size == 0:
                    raise ModelFormatError(self.path, "empty file, expected a zip archive", offset=0)
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise ModelFormatError(self.path, f"cannot read weights file: {e.strerror or e}") from None
        # name -> (offset of the central directory record, local header offset, stored size, method, flags)
        self._entries: dict[str, tuple[int, int, int, int, int]] = {}
        self._read_central_directory()

    # -- parsing --------------------------------------------------------------------------------------
    def _fail(self, msg: str, offset: int) -> ModelFormatError:
        return ModelFormatError(self.path, msg, offset=offset)

    def _unpack(self, st: struct.Struct, offset: int, what: str) -> tuple:
        if offset < 0 or offset + st.size > self.size:
            raise self._fail(f"{what} at byte {offset} runs past the end of the file ({self.size} bytes)", offset)
        return st.unpack_from(self._mm, offset)

    def _read_central_directory(self) -> None:
        lo = max(0, self.size - _EOCD.size - _MAX_COMMENT)
        pos = self._mm.rfind(b"PK\x05\x06", lo)
        if pos < 0 or pos + _EOCD.size > self.size:
            raise self._fail("not a zip archive (no end-of-central-directory record)", self.size)
        _, _, _, _, count, cd_size, cd_offset, _ = self._unpack(_EOCD, pos, "end of central directory")
        if count == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:
            count, cd_size, cd_offset = self._read_zip64_end(pos)
        if cd_offset + cd_size > self.size:
            raise self._fail(f"central directory ({cd_size} bytes at {cd_offset}) runs past the end", cd_offset)
        if count * _CENTRAL.size > cd_size:
            raise self._fail(f"central directory claims {count} entries in {cd_size} bytes", cd_offset)
        offset = cd_offset
        for _ in range(count):
            offset = self._read_central_entry(offset, cd_offset + cd_size)

    def _read_zip64_end(self, eocd_pos: int) -> tuple[int, int, int]:
        sig, _, eocd64_pos, _ = self._unpack(_LOC64, eocd_pos - _LOC64.size, "zip64 locator")
        if sig != b"PK\x06\x07":
            raise self._fail("zip64 locator missing before the end-of-central-directory record", eocd_pos - 20)
        rec = self._unpack(_EOCD64, eocd64_pos, "zip64 end of central directory")
        if rec[0] != b"PK\x06\x06":
            raise self._fail("bad zip64 end-of-central-directory signature", eocd64_pos)
        return rec[7], rec[8], rec[9]

    def _read_central_entry(self, offset: int, end: int) -> int:
        rec = self._unpack(_CENTRAL, offset, "central directory entry")
        sig, _, _, flags, method, _, _, _, csize, usize, name_len, extra_len, comment_len, _, _, _, local = rec
        if sig != b"PK\x01\x02":
            raise self._fail("bad central directory entry signature", offset)
        name_at = offset + _CENTRAL.size
        nxt = name_at + name_len + extra_len + comment_len
        if nxt > end:
            raise self._fail("central directory entry runs past the directory", offset)
        raw_name = bytes(self._mm[name_at : name_at + name_len])
        name = raw_name.decode("utf-8" if flags & 0x800 else "cp437", errors="replace")
        csize, usize, local = self._zip64_extra(name_at + name_len, extra_len, csize, usize, local)
        if csize != usize and method == 0:
            raise self._fail(f"entry {name!r}: stored entry with different sizes {csize} != {usize}", offset)
        self._entries[name] = (offset, local, csize, method, flags)
        return nxt

    def _zip64_extra(self, at: int, length: int, csize: int, usize: int, local: int) -> tuple[int, int, int]:
        """Replaces the 0xFFFFFFFF fields with the values from the zip64 extra field (id 1), in zip order."""
        end = at + length
        while at + 4 <= end:
            tag, size = struct.unpack_from("<HH", self._mm, at)
            body, at = at + 4, at + 4 + size
            if at > end:
                raise self._fail("extra field runs past its entry", body - 4)
            if tag != 1:
                continue
            fields = [f for f in ("usize", "csize", "local") if {"usize": usize, "csize": csize,
                                                                  "local": local}[f] == 0xFFFFFFFF]
            if 8 * len(fields) > size:
                raise self._fail("zip64 extra field too short", body)
            vals = dict(zip(fields, struct.unpack_from(f"<{len(fields)}Q", self._mm, body), strict=True))
            usize, csize, local = vals.get("usize", usize), vals.get("csize", csize), vals.get("local", local)
        return csize, usize, local

    # -- access ---------------------------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def entry_bytes(self, name: str) -> tuple[memoryview, int]:
        """The stored bytes of `name` (a view of the mapped file) and their byte offset in the file."""
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
        return memoryview(self._mm)[data : data + size], data

    def array(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A read-only array over the entry's bytes; the entry must hold exactly prod(shape) elements."""
        raw, offset = self.entry_bytes(name)
        count = 1
        for d in shape:
            count *= d
        want = count * np.dtype(dtype).itemsize
        if len(raw) != want:
            raise self._fail(f"entry {name!r} holds {len(raw)} bytes, expected {want} for shape "
                             f"{tuple(shape)} {np.dtype(dtype).name}", offset)
        return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"), count=count).reshape(shape)


def write_stored_zip(path: str | Path, entries: Mapping[str, bytes | np.ndarray]) -> None:
    """Writes `entries` (name -> bytes or array, C order) as an uncompressed zip, like pnnx's writer."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        for name, data in entries.items():
            raw = np.ascontiguousarray(data).tobytes() if isinstance(data, np.ndarray) else bytes(data)
            z.writestr(zipfile.ZipInfo(name), raw)
