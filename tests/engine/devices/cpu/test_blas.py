"""engine.devices.cpu.blas's Blas.matmul against a float64 numpy product: MKL's sgemm when the `fast` extra is
installed, the numpy path always; strided rows, batched stacks, column splits over the thread pool."""

from __future__ import annotations

import numpy as np
import pytest

from engine.devices.cpu import blas as _blas
from engine.devices.cpu import threads as _threads
from engine.devices.cpu.blas import Blas


def _ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


def _close(got: np.ndarray, want: np.ndarray) -> None:
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale)


@pytest.fixture(params=["mkl", "numpy"])
def blas(request) -> Blas:
    if request.param == "numpy":
        return _blas.for_choice("numpy")
    chosen = _blas.for_choice("auto")
    if chosen.backend != "mkl":
        pytest.skip("the optional mkl wheel (extra `fast`) is not installed; the numpy case covers this path")
    return chosen


@pytest.fixture
def split_everything(monkeypatch):
    before = _threads.get_threads()
    monkeypatch.setattr(_threads, "MIN_WORK", 0)
    monkeypatch.setattr(_blas, "SPLIT_WORK", 0)
    _threads.set_threads(3)
    yield
    _threads.set_threads(before)


@pytest.mark.parametrize("m, k, n", [(1, 7, 5), (64, 147, 300), (17, 33, 1000), (3, 1, 129)])
def test_2d(blas, m, k, n):
    rng = np.random.default_rng(m * k + n)
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    out = np.full((m, n), np.nan, np.float32)
    blas.matmul(a, b, out)
    _close(out, _ref(a, b))


def test_2d_split_over_threads(blas, split_everything):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((40, 70), np.float32), rng.standard_normal((70, 1001), np.float32)
    out = np.full((40, 1001), np.nan, np.float32)
    blas.matmul(a, b, out)
    _close(out, _ref(a, b))


@pytest.mark.parametrize("m, n", [(1024, 49), (67, 7), (300, 63)])
def test_2d_few_columns_split_by_rows(blas, split_everything, m, n, monkeypatch):
    """Few columns and many rows (a 1x1 conv over a 7x7 map): row blocks of 16 over the threads, every row written
    once (a remainder block included)."""
    rows = []
    real = Blas._block_rows
    monkeypatch.setattr(Blas, "_block_rows", lambda self, *a: (rows.append(a[-2:]), real(self, *a))[1])
    rng = np.random.default_rng(m + n)
    a, b = rng.standard_normal((m, 96), np.float32), rng.standard_normal((96, n), np.float32)
    out = np.full((m, n), np.nan, np.float32)
    blas.matmul(a, b, out)
    _close(out, _ref(a, b))
    spans = sorted(rows)  # three chunks over the pool, or one on the calling thread when the pool was busy
    assert len(spans) in (1, 3) and spans[0][0] == 0 and spans[-1][1] == -(-m // 16)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_strided_views(blas):
    """Row-padded views (a column block of the output, a row block of the input) are read in place."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((30, 50), np.float32)[:, 5:45]
    b = rng.standard_normal((40, 90), np.float32)[:, 10:70]
    big = np.zeros((30, 100), np.float32)
    blas.matmul(a, b, big[:, 20:80])
    _close(big[:, 20:80], _ref(a, b))
    assert not big[:, :20].any() and not big[:, 80:].any()


@pytest.mark.parametrize("split", [False, True])
def test_batched_stacks(blas, split, request):
    if split:
        request.getfixturevalue("split_everything")
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((16, 24, 32), np.float32), rng.standard_normal((16, 32, 45), np.float32)
    out = np.empty((16, 24, 45), np.float32)
    blas.matmul(a, b, out)
    _close(out, _ref(a, b))
    w, xs = a[0], rng.standard_normal((4, 32, 45), np.float32)
    out4 = np.empty((4, 24, 45), np.float32)
    blas.matmul(w, xs, out4)
    _close(out4, _ref(w, xs))


def test_other_dtypes_and_layouts_fall_back(blas):
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    out = np.empty((6, 4))
    blas.matmul(a, b, out)
    _close(out, _ref(a, b))
    af, bf = a.astype(np.float32).T.copy().T, b.astype(np.float32)  # column-major a
    outf = np.empty((6, 4), np.float32)
    blas.matmul(af, bf, outf)
    _close(outf, _ref(af, bf))
