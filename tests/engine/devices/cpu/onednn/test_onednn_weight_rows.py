"""Constant matmul weights never lie in a plain (K, N) layout whose rows may alias in the cache
(engine/devices/cpu/onednn/matmul.py's unaliased_weights_md): where oneDNN has a packed layout it keeps it, where
it asks for plain rows (gemm:jit, hosts without AVX-512) the rows get LD_PAD floats more. Results against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import matmul as dnn
from engine.devices.cpu.onednn import objects as D

if not D.available():
    pytest.skip("oneDNN (libdnnl.so.3 from the onednn-cpu-gomp wheel) is not installed", allow_module_level=True)

RNG = np.random.default_rng(23)


def test_padded_rows_hold_the_operand_with_room_for_the_padding():
    md = dnn.unaliased_weights_md(3, 1024)
    assert md.nbytes >= (2 * (1024 + dnn.LD_PAD) + 1024) * 4
    assert md != D.MemoryDesc.plain((3, 1024))


@pytest.mark.parametrize("n", [1024, 40])  # a row of 4 KB, and a small odd one
def test_gemm_weights_are_packed_or_padded_and_exact(n):
    m, k = 5, 48
    w = RNG.standard_normal((n, k)).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    x = RNG.standard_normal((m, k)).astype(np.float32)
    gemm = dnn.Gemm(w, bias, None, False)
    out = np.full((m, n), np.nan, np.float32)
    gemm.run(x, None, out, None)
    expected = x.astype(np.float64) @ w.T.astype(np.float64) + bias
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)
    chosen = gemm.plan(m).pd.md(L.QUERY_WEIGHTS_MD)
    assert chosen != D.MemoryDesc.plain((k, n))  # blocked (brgemm) or the padded rows


def test_matmul_constant_operand_padded_and_exact():
    b = RNG.standard_normal((32, 2048)).astype(np.float32)
    a = RNG.standard_normal((2, 3, 32)).astype(np.float32)
    mm = dnn.MatMul(b)
    out = np.full((2, 3, 2048), np.nan, np.float32)
    mm.run(a, b, out, None)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-4)
    chosen = mm.plan_for(a.shape, b.shape, out.shape).pd.md(L.QUERY_WEIGHTS_MD)
    assert chosen != D.MemoryDesc.plain((32, 2048))
