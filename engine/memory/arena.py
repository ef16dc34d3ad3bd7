"""The arena: one preallocated, aligned byte buffer that typed views are cut from at planned offsets."""

from __future__ import annotations

import os

import numpy as np

from engine.errors import ArenaOverflowError
from engine.memory.planner import ALIGNMENT


def physical_memory() -> int | None:
    """This machine's memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


class Arena:
    """A single `np.uint8` buffer whose first byte is `alignment`-aligned. It is never reallocated."""

    def __init__(self, nbytes: int, alignment: int = ALIGNMENT):
        # checked before asking for it: a hostile or mistaken max shape (a file's (100000,100000) input) would
        # otherwise be a bare MemoryError, or with overcommit a buffer the first run cannot back
        memory = physical_memory()
        if memory is not None and nbytes > memory:
            raise ArenaOverflowError(f"an arena of {nbytes} bytes ({nbytes / 2**30:.1f} GiB) is more than this "
                                     f"machine's memory ({memory / 2**30:.1f} GiB)")
        raw = np.empty(nbytes + alignment, dtype=np.uint8)
        start = (-raw.ctypes.data) % alignment
        self.buffer: np.ndarray = raw[start:start + nbytes]
        self.nbytes = nbytes

    def view(self, offset: int, shape: tuple[int, ...], dtype: np.dtype, name: str = "") -> np.ndarray:
        """A C-contiguous array of `shape` and `dtype` over the bytes at `offset`."""
        dtype = np.dtype(dtype)
        n = dtype.itemsize
        for d in shape:
            n *= d
        if offset < 0 or offset + n > self.nbytes:
            raise ArenaOverflowError(f"{name or 'buffer'} needs bytes {offset}..{offset + n} but the arena holds "
                                     f"{self.nbytes}; create the instance with larger max_shapes")
        return self.buffer[offset:offset + n].view(dtype).reshape(shape)
