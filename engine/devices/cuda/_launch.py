"""Launch helpers shared by the CUDA kernel families: launch geometry, flat views, strides, a shape cache.

Every kernel here is a grid-stride loop over a flat index, so one launch shape serves any size. Under numba's
simulator (NUMBA_ENABLE_CUDASIM=1) each simulated thread is a Python thread, so launches use a single small
block there: the same kernel logic runs, just without thousands of OS threads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from numba import cuda


def _numba_cuda_config():
    try:
        from numba.cuda.core import config  # numba-cuda >= 0.20
    except ImportError:  # pragma: no cover - the numba.cuda bundled with older numba
        from numba import config
    return config


def is_simulator() -> bool:
    return bool(_numba_cuda_config().ENABLE_CUDASIM)


SIM = is_simulator()
# numba warns (NumbaPerformanceWarning) at each launch of fewer blocks than twice the multiprocessors: a batch-1
# model's small tensors launch grids of 3-90 blocks on purpose (one grid-stride loop a node), so on an H100 every
# model logged a dozen such lines, none of them actionable by a user.
_numba_cuda_config().CUDA_LOW_OCCUPANCY_WARNINGS = 0
BLOCK = 16 if SIM else 256
MAX_GRID = 1 if SIM else 4096
TILE = 8 if SIM else 16  # matmul tile edge (shared-memory arrays need a compile-time size)


def grid(n: int) -> tuple[int, int]:
    """(blocks, threads) for a grid-stride loop over n items."""
    return max(1, min(MAX_GRID, math.ceil(n / BLOCK))), BLOCK


def flat(a):
    """A 1-d view of a contiguous device array (0-d arrays become 1 long)."""
    return a.reshape(int(np.prod(a.shape, dtype=np.int64)))


def strides_of(shape: Sequence[int]) -> tuple[int, ...]:
    """C-order strides in elements."""
    out, s = [], 1
    for d in reversed(tuple(shape)):
        out.append(s)
        s *= int(d)
    return tuple(reversed(out))


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides that read `shape` broadcast to `out_shape` (0 on broadcast dims), right-aligned."""
    shape, rank = tuple(shape), len(out_shape)
    full = (1,) * (rank - len(shape)) + shape
    st = strides_of(full)
    return tuple(0 if d == 1 and o != 1 else s for d, o, s in zip(full, out_shape, st, strict=True))


def at_least_1d(*tuples: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Kernels index shape tuples, so rank-0 problems become rank 1 (a size-1 dim with stride 0)."""
    if len(tuples[0]):
        return tuples
    return tuple((1,) if i == 0 else (0,) for i in range(len(tuples)))


def by_shapes(plan: Callable[[list, list], tuple]) -> Callable[[list, list], tuple]:
    """Memoizes a host-side launch plan on the shapes of the call's inputs and outputs."""
    cache: dict[tuple, tuple] = {}

    def get(ins, outs) -> tuple:
        key = tuple(np.shape(a) for a in ins) + tuple(o.shape for o in outs)
        got = cache.get(key)
        if got is None:
            got = cache[key] = plan(ins, outs)
        return got

    return get


def dummy(dtype=np.float32):
    """A 1-element device array for optional kernel operands (bias, residual) that are absent."""
    return cuda.to_device(np.zeros(1, dtype))
