"""sgemm for the conv/linear kernels: Intel MKL's cblas through ctypes when the `mkl` wheel is installed
(the `fast` extra), else numpy's matmul (OpenBLAS). NNSERVE_BLAS=numpy (CpuOptions.blas) forces the numpy path.

Either library runs single-threaded (MKL's sequential layer; OpenBLAS limited to one thread by threads.py)
and the engine's own pool splits a large GEMM by columns, by rows (few columns) or by batch (ctypes and numpy
drop the GIL during the call): one set of threads for every kernel. Why: OpenBLAS's own threads busy-wait between
calls and fight the pool's numba kernels and any other process for the cores; on the loaded 2-core machine
ResNet-18 at 2 threads cost 850-1030 ms CPU (2.5-2.9 s wall) with OpenBLAS threading and 97 ms CPU (250 ms wall)
with one library thread and the pool split.
`numpy_cblas` gives numba code (loops/attention.py) the address of cblas_sgemm in numpy's own OpenBLAS, for kernels
that run many small GEMMs in one nogil call (the grouped attention).
Measured single-threaded on conv shapes: (64x147)x(147x12544) 105 vs 50 GFLOP/s, (64x64)x(64x12544) 125
vs 88, (512x4608)x(4608x49) 81 vs 74 (MKL vs OpenBLAS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info

from engine.devices.cpu.threads import parallel_for
from engine.errors import EngineError

_ROW_MAJOR, _NO_TRANS, _SEQUENTIAL = 101, 111, 1
_F32 = np.dtype(np.float32)
# Below this many multiply-adds a GEMM is not split: the pool hop would cost more than it saves.
SPLIT_WORK = 1 << 21


@functools.cache
def _mkl() -> ctypes.CDLL | None:
    """libmkl_rt, loaded once per process (MKL_Set_Threading_Layer must precede any other MKL call)."""
    names = sorted(Path(sys.prefix, "lib").glob("libmkl_rt.so*"), reverse=True)
    found = ctypes.util.find_library("mkl_rt")
    for name in [*map(str, names), *([found] if found else [])]:
        try:
            lib = ctypes.CDLL(name)
            lib.MKL_Set_Threading_Layer(_SEQUENTIAL)
        except (OSError, AttributeError):
            continue
        i, f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
        lib.cblas_sgemm.restype = None
        lib.cblas_sgemm.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
        return lib
    return None


# cblas_sgemm's name in the OpenBLAS builds numpy ships or links: scipy-openblas (numpy's wheels), 64- and 32-bit
# integers, then a system OpenBLAS; each with the name of its configuration string (which says USE64BITINT).
_OPENBLAS_NAMES = (("scipy_cblas_sgemm64_", "scipy_openblas_get_config64_"),
                   ("scipy_cblas_sgemm", "scipy_openblas_get_config"),
                   ("cblas_sgemm64_", "openblas_get_config64_"),
                   ("cblas_sgemm", "openblas_get_config"))


def _in_numpy(path: str) -> bool:
    """Whether a loaded library lies in numpy's own install (numpy.libs beside the package, or inside it): the
    OpenBLAS numpy's wheels bundle, not one another package brought (OpenCV's, SciPy's)."""
    root = Path(np.__file__).resolve().parent
    where = Path(path).resolve()
    return where.is_relative_to(root) or where.parent == root.parent / "numpy.libs"


@functools.cache
def numpy_cblas() -> tuple[int, bool] | None:
    """(address, 64-bit integers) of cblas_sgemm in the OpenBLAS numpy's wheels bundle, for numba code that calls
    it without the GIL (loops/attention.py); None when numpy runs on another BLAS (MKL, a system OpenBLAS) or the
    library does not state its integer width in its configuration string (callers then keep numpy's matmul). The
    library is numpy's, so threads.py's one-thread limit (threadpoolctl) applies to it."""
    for info in threadpool_info():
        if info.get("internal_api") != "openblas" or not _in_numpy(info.get("filepath") or ""):
            continue
        try:
            lib = ctypes.CDLL(info["filepath"])  # already loaded by numpy: the same handle
        except OSError:
            continue
        for gemm, config in _OPENBLAS_NAMES:
            fn, conf = getattr(lib, gemm, None), getattr(lib, config, None)
            if fn is None or conf is None:
                continue
            conf.restype, conf.argtypes = ctypes.c_char_p, []
            return ctypes.cast(fn, ctypes.c_void_p).value, b"USE64BITINT" in (conf() or b"")
    return None


def for_choice(choice: str) -> Blas:
    """"auto": MKL's sgemm when the wheel is installed (MKL is then loaded), else numpy; "mkl": MKL's, or an error
    when it is not installed (the user asked for it); "numpy": numpy's matmul."""
    mkl = _mkl() if choice != "numpy" else None
    if choice == "mkl" and mkl is None:
        raise EngineError("NNSERVE_BLAS=mkl asks for MKL's sgemm, but MKL (libmkl_rt) was not found: install the "
                          "`fast` extra (pip install 'nnserve[fast]') or unset NNSERVE_BLAS")
    return Blas(mkl.cblas_sgemm if mkl is not None else None)


def _rows_ok(a: np.ndarray) -> bool:
    """Row-major 2-D float32 with unit column stride (rows may be padded), as cblas reads it."""
    return (a.dtype == _F32 and a.ndim == 2 and a.strides[1] == 4 and a.strides[0] % 4 == 0
            and a.strides[0] >= 4 * a.shape[1])


class Blas:
    """out = a @ b on one library: `sgemm` (cblas_sgemm) or numpy's matmul when it is None."""

    def __init__(self, sgemm):
        self._sgemm = sgemm

    @property
    def backend(self) -> str:
        return "mkl" if self._sgemm is not None else "numpy"

    def _cols(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, lo: int, hi: int) -> None:
        if self._sgemm is None:
            np.matmul(a, b[:, lo:hi], out=out[:, lo:hi])
            return
        m, k = a.shape
        self._sgemm(_ROW_MAJOR, _NO_TRANS, _NO_TRANS, m, hi - lo, k, 1.0, a.ctypes.data, a.strides[0] // 4,
                    b.ctypes.data + 4 * lo, b.strides[0] // 4, 0.0, out.ctypes.data + 4 * lo, out.strides[0] // 4)

    def _batch(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, lo: int, hi: int) -> None:
        if self._sgemm is None:
            np.matmul(a[lo:hi], b[lo:hi], out=out[lo:hi])
            return
        for i in range(lo, hi):
            self._cols(a[i], b[i], out[i], 0, b.shape[2])

    def matmul(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, split: bool = True) -> None:
        """out = a @ b for 2-D operands, a 2-D a with a 3-D batch b, or 3-D stacks of equal batch (as np.matmul).
        `split=False` keeps a 2-D one on the calling thread."""
        if min(a.shape[-2:] + b.shape[-1:]) == 0:
            np.matmul(a, b, out=out)
            return
        if a.ndim == b.ndim == out.ndim == 2 and _rows_ok(a) and _rows_ok(b) and _rows_ok(out):
            work = a.shape[0] * a.shape[1] * b.shape[1]
            n = b.shape[1]
            if work < SPLIT_WORK or not split or n < 64 and a.shape[0] < 64:
                self._cols(a, b, out, 0, n)
                return
            if n < 64:  # few columns (a 1x1 conv over a 7x7 map: 49), many rows: row blocks instead
                parallel_for(self._block_rows, -(-a.shape[0] // 16), work, a, b, out)
                return
            # Column blocks in multiples of 16 floats keep each thread's stores on its own cache lines.
            blocks = -(-n // 16)
            parallel_for(self._block_cols, blocks, work, a, b, out, n)
            return
        if a.ndim == 2 and b.ndim == out.ndim == 3 and b.shape[0] == out.shape[0]:  # one weight, a batch of inputs
            for i in range(b.shape[0]):
                self.matmul(a, b[i], out[i])
            return
        if (a.ndim == b.ndim == out.ndim == 3 and a.shape[0] == b.shape[0] == out.shape[0]
                and all(_rows_ok(t[0]) for t in (a, b, out))):
            work = a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
            parallel_for(self._batch, a.shape[0], work if work >= SPLIT_WORK else 0, a, b, out)
            return
        np.matmul(a, b, out=out)

    def _block_rows(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, lo: int, hi: int) -> None:
        r0, r1 = 16 * lo, min(a.shape[0], 16 * hi)
        self._cols(a[r0:r1], b, out[r0:r1], 0, b.shape[1])

    def _block_cols(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, n: int, lo: int, hi: int) -> None:
        self._cols(a, b, out, 16 * lo, min(n, 16 * hi))
