"""Byte-level encoder for `.tnnmodel` files: the inverse of the cursor in `tnnmodel.py`."""

from __future__ import annotations

import struct

import numpy as np

from engine.formats.tnn.constants import DATA_TYPES, DT_FLOAT, DT_HALF, DTYPE_CODES, MAGIC_V1, MAGIC_V2


class Serializer:
    def __init__(self, version: int = 2):
        self.version = version
        self.parts: list[bytes] = []

    @property
    def magic(self) -> int:
        return MAGIC_V2 if self.version == 2 else MAGIC_V1

    def u32(self, v: int) -> None:
        self.parts.append(struct.pack("<I", v & 0xFFFFFFFF))

    def i32(self, v: int) -> None:
        self.parts.append(struct.pack("<i", v))

    def string(self, s: str) -> None:
        b = s.encode("utf-8")
        self.i32(len(b))
        self.parts.append(b)

    def raw(self, arr: np.ndarray | None, code: int | None = None, *, fp16: bool = False) -> None:
        """A RawBuffer. Float data is stored as half when `fp16` (rounded to nearest) unless `code` says otherwise."""
        if arr is None:  # an empty buffer: magic, type, zero length and nothing else
            self.u32(self.magic)
            self.i32(DT_FLOAT if code is None else code)
            self.i32(0)
            return
        arr = np.asarray(arr)
        if code is None:
            code = DT_HALF if fp16 and arr.dtype.kind == "f" else DTYPE_CODES.get(arr.dtype, DT_FLOAT)
        data = np.ascontiguousarray(arr, dtype=DATA_TYPES[code]).tobytes()
        self.u32(self.magic)
        self.i32(code)
        self.i32(len(data))
        if not data:
            return
        if self.version == 2:
            self.i32(arr.ndim)
            for d in arr.shape:
                self.i32(d)
        self.parts.append(data)

    def getvalue(self) -> bytes:
        return b"".join(self.parts)
