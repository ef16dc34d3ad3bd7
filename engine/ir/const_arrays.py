"""How a loaded graph holds its constant data (weights, folded constants): in arrays of its own, each starting
on a 64-byte boundary (SIMD kernels and BLAS then take them without copying) and read-only (requests share
them: a kernel that tried to write one would change every later result)."""

from __future__ import annotations

import numpy as np

from engine.ir.graph import Graph

ALIGNMENT = 64


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on an ALIGNMENT-byte boundary (unless it is empty:
    numpy gives an empty slice its base's address)."""
    dtype = np.dtype(dtype)
    nbytes = dtype.itemsize
    for d in shape:
        nbytes *= d
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def is_frozen(arr: np.ndarray) -> bool:
    """Read-only, C-contiguous and aligned (an empty array has no data to align): what `frozen` makes of one."""
    return not arr.flags.writeable and arr.flags.c_contiguous and (arr.nbytes == 0
                                                                     or arr.ctypes.data % ALIGNMENT == 0)


def frozen(arr: np.ndarray) -> np.ndarray:
    """`arr` itself when it is already frozen, else a read-only aligned copy (object arrays: read-only only)."""
    if arr.dtype.hasobject or arr.nbytes == 0:
        arr = arr.view()
        arr.flags.writeable = False
        return arr
    if is_frozen(arr):
        return arr
    out = aligned_empty(arr.shape, arr.dtype)
    np.copyto(out, arr)
    out.flags.writeable = False
    return out


def freeze_constants(graph: Graph) -> Graph:
    """Every constant value and node attribute array of `graph` made frozen (copied only where needed)."""
    for v in graph.values():
        if isinstance(v.const, np.ndarray):
            v.const = frozen(v.const)
    for node in graph.nodes:
        for key, a in node.attrs.items():
            if isinstance(a, np.ndarray):
                node.attrs[key] = frozen(a)
    return graph
