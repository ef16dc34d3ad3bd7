"""The cblas_sgemm call of engine.devices.cpu.loops.attention, from numba code without the GIL (the grouped
attention's nogil path), against a float64 numpy product; the 32-bit call against a stand-in library that records
what it receives; blas.numpy_cblas's choice of numpy's own OpenBLAS."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from engine.devices.cpu import blas
from engine.devices.cpu.loops import attention as cblas  # its cblas_sgemm call and address helpers

FOUND = blas.numpy_cblas()
needs_blas = pytest.mark.skipif(FOUND is None, reason="numpy's BLAS is not an OpenBLAS whose cblas_sgemm is known")


def _padded(rng, rows: int, cols: int, pad: int) -> np.ndarray:
    """rows x cols float32 whose rows lie `pad` floats apart beyond their width (a leading dimension > cols)."""
    return rng.standard_normal((rows, cols + pad)).astype(np.float32)[:, :cols]


@needs_blas
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 5, 3), (49, 49, 32), (64, 16, 197), (3, 130, 1)])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("pad", [0, 5])
def test_sgemm_matches_a_float64_product(m, n, k, trans_b, pad):
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a = _padded(rng, m, k, pad)
    b = _padded(rng, n, k, pad) if trans_b else _padded(rng, k, n, pad)
    c = _padded(rng, m, n, pad + 1)
    alpha = np.float32(0.37)
    pads = c.base[:, n:].copy()
    gemm, wide = FOUND
    cblas.sgemm(gemm, wide, trans_b, m, n, k, alpha, cblas.address(a), a.strides[0] // 4, cblas.address(b),
                b.strides[0] // 4, cblas.address(c), c.strides[0] // 4)
    want = alpha * (a.astype(np.float64) @ (b.T if trans_b else b).astype(np.float64))
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(c.base[:, n:], pads)  # nothing written past the rows' width


def test_the_32_bit_call_hands_an_lp64_library_32_bit_integers():
    got: list[tuple] = []
    i32, f32, p = ctypes.c_int32, ctypes.c_float, ctypes.c_void_p
    proto = ctypes.CFUNCTYPE(None, i32, i32, i32, i32, i32, i32, f32, p, i32, p, i32, f32, p, i32)
    fake = proto(lambda *args: got.append(args))
    cblas.sgemm(ctypes.cast(fake, ctypes.c_void_p).value, False, True, 3, 4, 5, np.float32(0.5), 4096, 7, 8192, 9,
                12288, 11)
    assert got == [(cblas.ROW_MAJOR, cblas.NO_TRANS, cblas.TRANS, 3, 4, 5, 0.5, 4096, 7, 8192, 9, 0.0, 12288, 11)]


def test_row_at_and_address_see_the_same_memory():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    row = cblas.row_at(cblas.address(x[2]), 6)
    row *= 2  # a view: x changes
    np.testing.assert_array_equal(x[2], 2 * np.arange(12, 18, dtype=np.float32))
    assert cblas.address(x[1:, 2:]) == x[1:, 2:].ctypes.data


@needs_blas
def test_numpy_cblas_takes_numpy_own_openblas_and_its_integer_width():
    """The library in numpy's own folder (not another package's OpenBLAS that happens to be loaded), whose cblas_sgemm
    the GEMM test above ran correctly with the width found."""
    gemm, wide = FOUND
    ours = [i for i in threadpool_info() if i.get("internal_api") == "openblas"
            and blas._in_numpy(i.get("filepath") or "")]
    assert ours, "numpy's OpenBLAS is not among the loaded libraries"
    lib = ctypes.CDLL(ours[0]["filepath"])
    assert gemm in {ctypes.cast(getattr(lib, g), ctypes.c_void_p).value for g, _ in blas._OPENBLAS_NAMES
                    if hasattr(lib, g)}
    assert isinstance(wide, bool)
