"""The vector Winograd transforms (engine/devices/cpu/conv/winograd_simd.py) tile by tile against numpy
references, at blocks of 8 lanes (AVX2's) and 16 (AVX-512's, two vector halves), whatever block this machine's
oneDNN prefers: padded and clipped tiles, a chunk that starts past tile 0, every epilogue and the residual."""

from __future__ import annotations

import numpy as np
import pytest

from engine.devices.cpu.conv import winograd_simd as S
from engine.devices.cpu.conv.winograd_blocked_loops import ACT_CLIP, ACT_LEAKY, ACT_NONE, ACT_RELU

BT = {4: np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
                   [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], float),
      2: np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], float)}
AT = {4: np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], float),
      2: np.array([[1, 1, 1, 0], [0, 1, -1, -1]], float)}
rng = np.random.default_rng(7)


def tiles_of(h: int, w: int, m: int) -> tuple[int, int]:
    return -(-h // m), -(-w // m)


def input_reference(x: np.ndarray, m: int, pads: tuple[int, int], t0: int, t1: int) -> np.ndarray:
    """v[alpha a + b, t - t0, c] = (B^T d B)[a, b] of tile t's zero-padded patch, x (N, Cb, H, W, B)."""
    n_, cb, h, w, b = x.shape
    alpha, (pt, pl) = m + 2, pads
    oh, ow = h + 2 * pt - 2, w + 2 * pl - 2
    th, tw = tiles_of(oh, ow, m)
    plain = x.transpose(0, 1, 4, 2, 3).reshape(n_, cb * b, h, w).astype(np.float64)
    padded = np.zeros((n_, cb * b, th * m + 2, tw * m + 2))
    padded[:, :, pt:pt + h, pl:pl + w] = plain[:, :, :th * m + 2 - pt, :tw * m + 2 - pl]
    v = np.empty((alpha * alpha, t1 - t0, cb * b))
    for t in range(t0, t1):
        n, r = divmod(t, th * tw)
        y0, x0 = m * (r // tw), m * (r % tw)
        d = padded[n, :, y0:y0 + alpha, x0:x0 + alpha]
        v[:, t - t0] = np.einsum("ai,cij,bj->abc", BT[m], d, BT[m]).reshape(alpha * alpha, -1)
    return v


def output_reference(mm: np.ndarray, y_shape, m: int, t0: int, t1: int, bias, z, act, lo, hi) -> dict:
    """{(n, row, col): value (K,)} of act(A^T M A + bias (+ z)) for tiles [t0, t1), clipped to y."""
    n_, kb, oh, ow, b = y_shape
    alpha = m + 2
    th, tw = tiles_of(oh, ow, m)
    out = {}
    for t in range(t0, t1):
        n, r = divmod(t, th * tw)
        y0, x0 = m * (r // tw), m * (r % tw)
        tile = np.einsum("ia,abk,jb->ijk", AT[m], mm[:, t - t0].reshape(alpha, alpha, -1).astype(np.float64), AT[m])
        for i in range(min(m, oh - y0)):
            for j in range(min(m, ow - x0)):
                val = tile[i, j] + bias
                if z is not None:
                    val = val + z[n, :, y0 + i, x0 + j].reshape(-1)
                if act == ACT_RELU:
                    val = np.maximum(val, 0)
                elif act == ACT_CLIP:
                    val = np.clip(val, lo, hi)
                elif act == ACT_LEAKY:
                    val = np.where(val < 0, val * lo, val)
                out[(n, y0 + i, x0 + j)] = val
    return out


@pytest.mark.parametrize("m", [4, 2])
@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("shape,pads", [((2, 11, 9), (1, 1)), ((1, 7, 7), (1, 1)), ((1, 10, 12), (0, 2))])
def test_input_transform_matches_numpy(m, block, shape, pads):
    n, h, w = shape
    x = rng.standard_normal((n, 2, h, w, block)).astype(np.float32)
    th, tw = tiles_of(h + 2 * pads[0] - 2, w + 2 * pads[1] - 2, m)
    t0, t1 = 1, n * th * tw  # a chunk that does not start at tile 0
    v = np.full(((m + 2) ** 2, t1 - t0, 2 * block), np.nan, np.float32)
    slices = 3
    S.input_transform(x, v, m, t0, t1, th, tw, pads[0], pads[1], slices, 0, 2 * slices)
    np.testing.assert_allclose(v, input_reference(x, m, pads, t0, t1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m", [4, 2])
@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("act,lo,hi", [(ACT_NONE, 0.0, 0.0), (ACT_RELU, 0.0, 0.0), (ACT_CLIP, -0.5, 0.7),
                                       (ACT_LEAKY, 0.1, 0.0)])
@pytest.mark.parametrize("residual", [False, True])
def test_output_transform_matches_numpy(m, block, act, lo, hi, residual):
    y_shape = (2, 2, 9, 7, block)  # 9x7: the last tile row and column are clipped for m = 4 and m = 2
    th, tw = tiles_of(9, 7, m)
    t0, t1 = 2, 2 * th * tw
    mm = rng.standard_normal(((m + 2) ** 2, t1 - t0, 2 * block)).astype(np.float32)
    bias = rng.standard_normal(2 * block).astype(np.float32)
    z = rng.standard_normal(y_shape).astype(np.float32) if residual else None
    y = np.full(y_shape, 7.0, np.float32)  # tiles before t0 keep this
    S.output_transform(mm, y, y if z is None else z, residual, bias, act, lo, hi, m, t0, t1, th, tw, 3, 0, 6)
    want = output_reference(mm, y_shape, m, t0, t1, bias, z, act, lo, hi)
    for (n, r, c), value in want.items():
        np.testing.assert_allclose(y[n, :, r, c].reshape(-1), value, rtol=1e-5, atol=1e-4, err_msg=f"{n, r, c}")
    before = [(n, r, c) for n in range(2) for r in range(9) for c in range(7) if (n, r, c) not in want]
    assert before and all((y[n, :, r, c] == 7.0).all() for n, r, c in before)  # tiles before t0: not written
