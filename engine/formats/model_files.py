"""Opening model files and reading their bytes into arrays the loaded model owns.

A loaded model must not change when its files do (rewritten in place, truncated, replaced): every weight is read
once, at load, into memory of its own, and no file handle or mapping outlives the load. The arrays are held as
engine/ir/const_arrays.py says: 64-byte aligned and read-only. Callers check every size against the file's real
size before asking for a buffer, so a lying header costs at most what the file holds.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

import numpy as np

from engine.errors import ModelFormatError
from engine.ir.const_arrays import aligned_empty

_CHUNK = 1 << 20  # elements widened at a time by read_float32


def open_model_file(path: str | Path, failure: str) -> BinaryIO:
    """Opens a regular file for reading; anything else (missing, a directory, a FIFO, a device) raises
    ModelFormatError starting with `failure` ("cannot read weights file: ...")."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ModelFormatError(str(path), f"{failure}: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ModelFormatError(str(path), f"{failure}: not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def file_size(f: BinaryIO) -> int:
    return os.fstat(f.fileno()).st_size


def read_file_bytes(path: str | Path, failure: str) -> bytes:
    """The whole content of a (text) model file."""
    with open_model_file(path, failure) as f:
        try:
            return f.read()
        except OSError as e:
            raise ModelFormatError(str(path), f"{failure}: {e.strerror or e}") from None


def empty_array(dtype: np.dtype) -> np.ndarray:
    """A read-only empty array, for attributes and buffers that store no data."""
    arr = aligned_empty((0,), dtype)
    arr.flags.writeable = False
    return arr


def read_exact(f: BinaryIO, out: memoryview, path: str, offset: int, what: str) -> None:
    """Fills `out` from `f`'s current position, which is byte `offset`; a file that ends early (it was truncated
    after its size was checked) raises ModelFormatError."""
    done = 0
    while done < len(out):
        try:
            got = f.readinto(out[done:])
        except OSError as e:
            raise ModelFormatError(path, f"{what}: read failed: {e.strerror or e}", offset=offset + done) from None
        if not got:
            raise ModelFormatError(path, f"{what}: the file ends at byte {offset + done}, {len(out) - done} bytes "
                                         "short (was it changed while loading?)", offset=offset + done)
        done += got


def read_array(f: BinaryIO, path: str, offset: int, dtype: np.dtype, shape: tuple[int, ...],
               what: str) -> np.ndarray:
    """A read-only aligned array of `shape` filled from `f`'s current position (byte `offset`); the caller has
    checked that the file holds that many bytes there."""
    arr = aligned_empty(shape, dtype)
    read_exact(f, memoryview(arr.reshape(-1).view(np.uint8)), path, offset, what)
    arr.flags.writeable = False
    return arr


def read_float32(f: BinaryIO, path: str, offset: int, shape: tuple[int, ...], what: str, *,
                 bfloat16: bool) -> np.ndarray:
    """Like `read_array` for 2-byte floats (IEEE half, or bfloat16 when `bfloat16`) stored little-endian, widened
    exactly to float32 as they are read: a chunk at a time, so that the stored copy never costs more than
    _CHUNK elements beside the result."""
    out = aligned_empty(shape, np.dtype(np.float32))
    flat = out.reshape(-1)
    stored = np.empty(min(flat.size, _CHUNK), np.dtype("<u2") if bfloat16 else np.dtype("<f2"))
    for start in range(0, flat.size, _CHUNK):
        part = stored[: min(_CHUNK, flat.size - start)]
        read_exact(f, memoryview(part.view(np.uint8)), path, offset + 2 * start, what)
        if bfloat16:  # bfloat16 is the top half of a float32
            bits = flat[start : start + part.size].view(np.uint32)
            np.left_shift(part, 16, out=bits, dtype=np.uint32)
        else:
            flat[start : start + part.size] = part
    out.flags.writeable = False
    return out
