"""Attention's CPU kernel vs the reference, with its workspace (and without), float16 through the reference; the fused
float32 kernel on long sequences (several key blocks: the online softmax), masks with fully masked rows (zeros
or NaN as the node says), broadcast heads, odd block remainders, smaller shapes after the max."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from op_harness import (
    assert_close,
    build_kernel,
    check_golden,
    check_kernel,
    cpu_device,
    get_op,
    infos_of,
    kernel_peak_bytes,
    kernel_workspace,
    load_cases,
    make_node,
    reference,
    run_kernel,
)

from engine.devices.cpu import attention as fused
from engine.devices.cpu import threads as pool
from engine.devices.cpu.onednn import matmul as dnn
from engine.devices.cpu.onednn import objects as onednn

RNG = np.random.default_rng(8)


def _x(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("mask", [None, "float", "bool"])
@pytest.mark.parametrize("causal", [False, True])
def test_kernel_matches_reference(mask, causal):
    q, k, v = _x(2, 3, 6, 8), _x(2, 3, 9, 8), _x(2, 3, 9, 5)
    inputs = [q, k, v]
    if mask == "float":
        inputs.append(_x(6, 9))
    elif mask == "bool":
        m = RNG.random((2, 1, 6, 9)) > 0.3
        m[0, 0, 2] = False  # nothing to attend to: zeros as torch
        inputs.append(m)
    node = make_node("Attention", len(inputs), params={"scale": None, "is_causal": causal})
    check_kernel(node, inputs)
    small = [q[:1, :, :4].copy(), k[:1, :, :5].copy(), v[:1, :, :5].copy()]
    if mask is not None:
        small.append(inputs[3][..., :4, :5].copy() if mask == "float" else inputs[3][:1, :, :4, :5].copy())
    check_kernel(node, small, inputs)


def test_unfused_workspace_holds_the_scores():
    q, k, v = (a.astype(np.float64) for a in (_x(2, 4, 6, 8), _x(2, 4, 10, 8), _x(2, 4, 10, 8)))
    node = make_node("Attention", 3)
    assert kernel_workspace(node, infos_of([q, k, v])) == 2 * 4 * 6 * 10 * 8
    check_kernel(node, [q, k, v], rtol=1e-10, atol=1e-12)


def test_fused_workspace_is_one_tile_per_thread():
    """4096 tokens: the scores of every head would take 512 MiB; the fused kernel holds a tile per thread."""
    info = [fused.TensorInfo((2, 8, 4096, 64), np.float32)] * 3
    node = make_node("Attention", 3)
    ws = kernel_workspace(node, info)
    assert ws == kernel_workspace(node, [fused.TensorInfo((1, 1, 4096, 64), np.float32)] * 3)  # not per head
    # per thread: the long-sequence tile; the query block, accumulator and product of its 256 rows x 64; small rows
    assert ws <= fused.get_threads() * (fused.LONG_TILE_BYTES + 3 * 256 * 64 * 4 + 8192) + 64


def test_kernel_without_workspace_still_runs():
    q, k, v = _x(1, 3, 4), _x(1, 5, 4), _x(1, 5, 2)
    node = make_node("Attention", 3, params={"scale": 0.5})
    op = get_op("Attention")
    out = np.empty((1, 3, 2), np.float32)
    build_kernel(node, infos_of([q, k, v]))[0]([q, k, v], [out], None)
    np.testing.assert_allclose(out, op.reference(node, [q, k, v])[0], rtol=1e-5, atol=1e-6)


def test_kernel_keeps_scores_in_the_workspace():
    q = _x(2, 4, 64, 32)
    node = make_node("Attention", 3, params={"is_causal": True})
    assert kernel_peak_bytes(node, [q, q, q]) < 16 * 1024  # the scores alone would be 128 KiB


def test_float16_runs_through_the_reference_path():
    q = _x(2, 5, 4).astype(np.float16)
    check_kernel(make_node("Attention", 3), [q, q, q], rtol=1e-2, atol=1e-2)


def _mask(kind: str | None, batch: tuple, L: int, S: int, dead_rows=(), nan_rows=False):
    if kind is None:
        return None
    if kind == "bool":
        m = RNG.random((*batch, L, S)) > 0.2
        m[..., list(dead_rows), :] = False
        return m
    m = np.where(RNG.random((*batch, L, S)) > 0.2, RNG.standard_normal((*batch, L, S)), -np.inf).astype(np.float32)
    m[..., list(dead_rows), :] = -np.inf
    return m


@pytest.mark.parametrize("L,S", [(70, 1030), (1100, 1300), (33, 2600), (1025, 17)])
@pytest.mark.parametrize("mask", [None, "bool", "float"])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_long_sequences_match_the_reference(L, S, mask, causal):
    """Beyond MAX_ONE_BLOCK keys the softmax runs online over key blocks; masked rows fall in several blocks."""
    q, k, v = _x(1, 2, L, 8), _x(1, 2, S, 8), _x(1, 2, S, 5)
    inputs = [q, k, v]
    m = _mask(mask, (1, 1), L, S, dead_rows=(0, L // 2, L - 1))
    if m is not None:
        inputs.append(m)
    node = make_node("Attention", len(inputs), params={"is_causal": causal})
    check_kernel(node, inputs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("onednn_on", [False, True])
@pytest.mark.parametrize("L,S,mask,strided", [(300, 700, None, False), (600, 1300, "float", False),
                                              (600, 1300, None, True), (70, 1030, "bool", True)])
def test_tile_gemms_on_onednn_or_blas(onednn_on, L, S, mask, strided, monkeypatch):
    """The blocked path's tile GEMMs on oneDNN (one plan per tile shape, a runner per thread) or BLAS, as the
    device's options say: query-row and key-block remainders, q, k, v read through the strides of a (B, T, H, D)
    layout with scale 1 (q read in place). (A strided output: test_packed_attention.py.)"""
    if onednn_on and not onednn.available():
        pytest.skip("oneDNN is not installed")
    runs = _count_runs(monkeypatch)
    if strided:
        q, k, v = (_x(1, n, 2, 8).transpose(0, 2, 1, 3) for n in (L, S, S))
    else:
        q, k, v = _x(1, 2, L, 8), _x(1, 2, S, 8), _x(1, 2, S, 8)
    inputs = [q, k, v]
    m = _mask(mask, (1, 1), L, S, dead_rows=(0, L - 1))
    if m is not None:
        inputs.append(m)
    node = make_node("Attention", len(inputs), params={"scale": 1.0} if strided else {})
    check_kernel(node, inputs, rtol=1e-4, atol=1e-5, device=cpu_device(onednn=onednn_on))
    assert bool(runs) == onednn_on


@pytest.mark.skipif(not onednn.available(), reason="oneDNN is not installed")
def test_tile_plans_start_over_past_their_cap(monkeypatch):
    """Sequence lengths that keep changing: past MAX_PLANS the tile plans (and every slot's runners) are dropped
    and made again; each run still matches the reference."""
    monkeypatch.setattr(fused._Tiles, "MAX_PLANS", 4)
    made = []
    real = dnn.ThreadPlan.strided
    monkeypatch.setattr(dnn.ThreadPlan, "strided", lambda *a: (made.append(1), real(*a))[1])
    q, k, v = _x(1, 2, 700, 8), _x(1, 2, 1300, 8), _x(1, 2, 1300, 8)
    node = make_node("Attention", 3)
    kernel, workspace = build_kernel(node, infos_of([q, k, v]))
    # query counts whose even blocks (fused.even_rows) end short: two row counts a run, as two key counts
    shapes = [(700, 1300), (650, 1290), (610, 1100), (700, 1300), (333, 1030), (650, 1290)]
    for L, S in shapes:
        inputs = [q[:, :, :L], k[:, :, :S], v[:, :, :S]]
        out = np.empty((1, 2, L, 8), np.float32)
        kernel(inputs, [out], workspace)
        assert_close(out, reference(node, inputs)[0], 1e-4, 1e-5, f"L {L} S {S}")
    assert len(made) == 2 * 4 * len(shapes)  # four tile shapes a run, each past the cap: every run makes its own


def _count_runs(monkeypatch) -> list:
    """One entry per oneDNN Runner.run call from now on."""
    runs: list = []
    real = dnn.Runner.run
    monkeypatch.setattr(dnn.Runner, "run", lambda self, *a: (runs.append(1), real(self, *a))[1])
    return runs


def _spy_prepare(monkeypatch, cls) -> list:
    """(plans object, the run's slots) of every `cls.prepare` call from now on."""
    seen: list = []
    real = cls.prepare
    monkeypatch.setattr(cls, "prepare", lambda self, call: (seen.append((self, call.slots)), real(self, call))[1])
    return seen


@pytest.mark.skipif(not onednn.available(), reason="oneDNN is not installed")
def test_slots_beyond_a_runs_threads_drop_their_runners_when_plans_start_over(monkeypatch):
    """A run uses only as many slots as there are threads: a slot left out when the plans start over drops its
    runners (and their plans) when a later run uses it again, rather than keeping them across the reset."""
    monkeypatch.setattr(fused._Tiles, "MAX_PLANS", 8)
    threads = [2]
    monkeypatch.setattr(fused, "get_threads", lambda: threads[0])
    seen = _spy_prepare(monkeypatch, fused._Tiles)
    q, k, v = _x(1, 2, 700, 8), _x(1, 2, 1300, 8), _x(1, 2, 1300, 8)
    node = make_node("Attention", 3)
    kernel, workspace = build_kernel(node, infos_of([q, k, v]))
    # 2 threads; 1 thread; 1 thread, past the cap (the plans start over); 2 threads again, under the cap
    for n, (L, S) in zip([2, 1, 1, 2], [(700, 1300), (650, 1290), (600, 1100), (600, 1100)], strict=True):
        threads[0] = n
        inputs = [q[:, :, :L], k[:, :, :S], v[:, :, :S]]
        out = np.empty((1, 2, L, 8), np.float32)
        kernel(inputs, [out], workspace)
        assert_close(out, reference(node, inputs)[0], 1e-4, 1e-5, f"L {L} S {S} threads {n}")
    tiles, slots = seen[-1]
    assert len(slots) == 2
    for slot in slots:
        assert set(slot.runners) == set(tiles.plans)
        for key, (qk, pv) in slot.runners.items():
            assert (qk.plan, pv.plan) == tiles.plans[key]


@pytest.mark.parametrize("masked_rows", ["zero", "nan"])
@pytest.mark.parametrize("S", [40, 1500])
def test_fully_masked_rows_follow_the_node(masked_rows, S):
    """A row with nothing to attend to: zeros (torch's scaled_dot_product_attention) or NaN (nn.MultiheadAttention,
    an explicit softmax), whether its keys are in one tile or several."""
    q, k, v = _x(2, 3, 20, 8), _x(2, 3, S, 8), _x(2, 3, S, 8)
    m = RNG.random((2, 1, 20, S)) > 0.5
    m[0, 0, 3] = False
    m[1, 0, 19] = False
    node = make_node("Attention", 4, params={"masked_rows": masked_rows})
    out = run_kernel(node, [q, k, v, m])[0]
    dead = out[0, :, 3], out[1, :, 19]
    for row in dead:
        assert (np.isnan(row).all() if masked_rows == "nan" else (row == 0).all())
    assert np.isfinite(np.delete(out[0], 3, axis=1)).all()
    check_kernel(node, [q, k, v, m], rtol=1e-4, atol=1e-5)


def test_fused_broadcast_heads_and_smaller_shapes():
    """k and v shared by every head (multi-query), an additive (N, 1, 1, S) padding mask; a smaller request after
    the max runs in the same workspace."""
    q, k, v = _x(2, 4, 300, 16), _x(2, 1, 1200, 16), _x(2, 1, 1200, 24)
    pad = np.zeros((2, 1, 1, 1200), np.float32)
    pad[1, ..., 900:] = np.finfo(np.float32).min
    node = make_node("Attention", 4, params={"scale": 0.2})
    check_kernel(node, [q, k, v, pad], rtol=1e-4, atol=1e-5)
    small = [q[:1, :, :77].copy(), k[:1, :, :1100].copy(), v[:1, :, :1100].copy(), pad[:1, ..., :1100].copy()]
    check_kernel(node, small, [q, k, v, pad], rtol=1e-4, atol=1e-5)


def test_fused_reads_strided_heads_in_place():
    """q, k, v as (N, H, L, D) views of (N, L, H, D) projections (a Transpose the runtime aliases)."""
    q, k, v = (_x(1, 500, 4, 16).transpose(0, 2, 1, 3) for _ in range(3))
    node = make_node("Attention", 3)
    fn, ws = build_kernel(node, infos_of([q, k, v]))
    out = np.empty((1, 4, 500, 16), np.float32)
    fn([q, k, v], [out], ws)
    np.testing.assert_allclose(out, get_op("Attention").reference(node, [q, k, v])[0], rtol=1e-4, atol=1e-5)


def test_fused_kernel_allocates_no_tiles():
    q = _x(1, 2, 1500, 16)
    node = make_node("Attention", 3, params={"is_causal": True})
    assert kernel_peak_bytes(node, [q, q, q]) < 64 * 1024  # one tile alone is 256 KiB


def test_nan_in_the_scores_stays_nan():
    q, k, v = _x(1, 1, 4, 8), _x(1, 1, 6, 8), _x(1, 1, 6, 8)
    k[0, 0, 2, 0] = np.nan
    node = make_node("Attention", 3)
    out = run_kernel(node, [q, k, v])[0]
    assert np.isnan(out).all()
    # the reference too (as torch): a NaN row's sum is NaN, not a fully masked row's 0
    assert np.isnan(reference(node, [q, k, v])[0]).all()


LONG_GOLDENS = load_cases(Path(__file__).resolve().parents[3] / "fixtures" / "ops" / "attention.npz")


@pytest.mark.parametrize("case", LONG_GOLDENS, ids=lambda c: c.name)
def test_fused_kernel_matches_torch_on_long_sequences(case):
    """torch's outputs (tools/make_attention_goldens.py): rel err < 1e-3, NaN and zero rows where torch has them."""
    assert case.inputs[1].shape[-2] > fused.MAX_ONE_BLOCK  # the keys span several tiles
    got = run_kernel(case.node(), case.inputs)[0]
    want = case.outputs[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert np.abs(got[finite] - want[finite]).max() < 1e-3 * np.abs(want[finite]).max()
    check_golden(case, rtol=1e-4, atol=1e-4)  # the numpy reference too


def test_long_goldens_present():
    names = {c.name for c in LONG_GOLDENS}
    assert {"long_causal", "long_bool_dead_rows_sdpa", "long_bool_dead_rows_softmax"} <= names
    out = {c.name: c.outputs[0] for c in LONG_GOLDENS}
    assert (out["long_bool_dead_rows_sdpa"][0, 0, 117] == 0).all()  # torch's sdpa: zeros
    assert np.isnan(out["long_bool_dead_rows_softmax"][0, 0, 117]).all()  # an explicit softmax: NaN


@pytest.mark.parametrize("shape", [(4, 4, 256, 16), (4, 4, 64, 20), (4, 4, 16, 24), (1, 3, 5, 7), (2, 9, 33, 8)])
def test_grouped_path_takes_whole_short_sequences(shape):
    """Heads whose (L, S) scores fit a tile run grouped (MobileViT-XXS's shapes, odd sizes); longer ones blocked."""
    *batch, L, e = shape
    g = fused.grouping(tuple(batch), L, L, e)
    assert g is not None and g.heads * 4 * L * L <= fused.TILE_BYTES
    q, k, v = _x(*shape), _x(*shape), _x(*shape)
    check_kernel(make_node("Attention", 3), [q, k, v], rtol=1e-4, atol=1e-5)
    assert fused.grouping((1, 8), 300, 300, 16) is None and fused.grouping((1, 8), 8, 1100, 16) is None


@pytest.mark.parametrize("mask", [None, "bool", "float"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("L,S,scale", [(16, 16, 0.3), (20, 64, 0.3), (64, 9, 0.3), (20, 64, -20.0)])
def test_grouped_path_masks_causal_and_dead_rows(L, S, scale, mask, causal):
    """The row-wise softmax: every mask kind broadcast over heads, causal with L != S (queries past the keys,
    keys past the queries), rows with nothing to attend to, an explicit scale (a negative one cannot ride in the
    exp as scale * (s - max): -20 spreads the scores past exp's range, so that would overflow)."""
    q, k, v = _x(2, 5, L, 12), _x(2, 5, S, 12), _x(2, 5, S, 7)
    inputs = [q, k, v]
    m = _mask(mask, (2, 1), L, S, dead_rows=(0, L - 1))
    if m is not None:
        inputs.append(m)
    for masked_rows in ("zero", "nan"):
        node = make_node("Attention", len(inputs), params={"is_causal": causal, "scale": scale,
                                                           "masked_rows": masked_rows})
        check_kernel(node, inputs, rtol=1e-4, atol=1e-5)


def test_grouped_path_broadcast_heads_strided_views_and_smaller_shapes():
    """k and v shared by the heads, q a transposed view, a 3-D call without heads; a smaller request after the max."""
    q = _x(2, 40, 6, 16).transpose(0, 2, 1, 3)
    k, v = _x(2, 1, 50, 16), _x(2, 1, 50, 24)
    node = make_node("Attention", 3)
    check_kernel(node, [q, k, v], rtol=1e-4, atol=1e-5)
    check_kernel(node, [q[:1, :, :7].copy(), k[:1, :, :11].copy(), v[:1, :, :11].copy()], [q, k, v], rtol=1e-4,
                 atol=1e-5)
    check_kernel(node, [_x(30, 8), _x(20, 8), _x(20, 4)], rtol=1e-4, atol=1e-5)


def test_grouped_path_nan_and_no_allocation():
    q, k, v = _x(1, 4, 16, 8), _x(1, 4, 16, 8), _x(1, 4, 16, 8)
    k[0, 1, 3, 0] = np.nan
    out = run_kernel(make_node("Attention", 3), [q, k, v])[0]
    assert np.isnan(out[0, 1]).all() and np.isfinite(np.delete(out[0], 1, axis=0)).all()
    assert kernel_peak_bytes(make_node("Attention", 3), [q, k, v]) < 4 * 1024  # the scores alone are 4 KiB


def test_grouped_path_with_no_queries():
    """A max shape without queries (or keys) sizes no tile and writes nothing (or zeros)."""
    q, k, v = _x(1, 2, 0, 4), _x(1, 2, 3, 4), _x(1, 2, 3, 4)
    assert run_kernel(make_node("Attention", 3), [q, k, v])[0].shape == (1, 2, 0, 4)
    out = run_kernel(make_node("Attention", 3), [_x(1, 2, 3, 4), _x(1, 2, 0, 4), _x(1, 2, 0, 4)])[0]
    assert (out == 0).all()


@pytest.mark.parametrize("L,S", [(1500, 49), (4096, 77), (1025, 256), (5000, 17)])
@pytest.mark.parametrize("mask", [None, "bool", "float"])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_path_splits_long_queries_over_few_keys(L, S, mask, causal):
    """Few keys, queries whose scores outgrow a tile (windows over a feature map, cross-attention to text tokens):
    one head and a block of queries per item, column-wise; the last block partial, causal rows past the first
    block, dead rows in several blocks."""
    g = fused.grouping((1, 2), L, S, 16)
    assert g is not None and g.heads == 1 and g.rows < L and g.rows * S * 4 <= fused.TILE_BYTES
    q, k, v = _x(1, 2, L, 16), _x(1, 2, S, 16), _x(1, 2, S, 24)
    inputs = [q, k, v]
    m = _mask(mask, (1, 1), L, S, dead_rows=(0, g.rows, L - 1))
    if m is not None:
        inputs.append(m)
    for masked_rows in ("zero", "nan"):
        node = make_node("Attention", len(inputs), params={"is_causal": causal, "masked_rows": masked_rows})
        check_kernel(node, inputs, rtol=1e-4, atol=1e-5)


def test_grouped_query_blocks_broadcast_heads_strided_views_and_smaller_shapes():
    """The split grouped path with k and v shared by the heads, q a transposed view, an additive padding mask, and a
    smaller request after the max (fewer blocks, a partial one)."""
    q = _x(2, 2000, 3, 32).transpose(0, 2, 1, 3)
    k, v = _x(2, 1, 77, 32), _x(2, 1, 77, 32)
    pad = np.zeros((2, 1, 1, 77), np.float32)
    pad[1, ..., 60:] = np.finfo(np.float32).min
    node = make_node("Attention", 4)
    assert fused.grouping((2, 3), 2000, 77, 32).rows < 2000
    check_kernel(node, [q, k, v, pad], rtol=1e-4, atol=1e-5)
    small = [q[:1, :, :900].copy(), k[:1, :, :50].copy(), v[:1, :, :50].copy(), pad[:1, ..., :50].copy()]
    check_kernel(node, small, [q, k, v, pad], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("S", [1, 1023, 1024, 1025, 1500, 4096])
@pytest.mark.parametrize("e", [32, 64, 128])
def test_fused_key_counts_around_the_tile_boundaries(S, e):
    """Key counts on both sides of MAX_ONE_BLOCK and the key tiles (one tile, a tile and one key, Whisper's 1500),
    head widths 32-128, against the numpy reference; an additive mask with a padded tail."""
    L = 300 if S > 1 else 5
    q, k, v = _x(1, 2, L, e), _x(1, 2, S, e), _x(1, 2, S, e)
    pad = np.zeros((1, 1, 1, S), np.float32)
    pad[..., S - S // 5:] = np.finfo(np.float32).min
    check_kernel(make_node("Attention", 3), [q, k, v], rtol=1e-4, atol=1e-5)
    check_kernel(make_node("Attention", 4), [q, k, v, pad], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("items,threads,rows,want", [
    (3, 2, 197, (2, 2)), (4, 2, 197, (4, 1)), (3, 1, 197, (3, 1)), (7, 3, 64, (6, 3)), (1, 2, 2, (0, 2)),
    (1, 2, 1, (1, 1)),  # one query: nothing to split
    (0, 2, 16, (0, 1)),
    (16, 12, 256, (12, 3)),  # 4 heads left for 12 threads: 3 ranges each, not 12 (48 ranges of 21 queries)
    (17, 12, 256, (12, 12)),  # 5 left: only 12 ranges each leave the busiest thread 110 rows (7 ranges: 111)
    (11, 12, 197, (0, 12)),  # halves would leave two to some threads (198 rows): no better than whole heads
    (3, 8, 197, (0, 8)), (6, 4, 197, (4, 2))])
def test_tail_split_leaves_whole_items_the_threads_divide(items, threads, rows, want):
    assert fused.tail_split(items, threads, rows) == want


def _busiest_rows(items: int, threads: int, rows: int, whole: int, parts: int) -> int:
    """The most query rows a thread computes when items t, t + T, ... go to thread t (run_slots)."""
    load = [0] * threads
    pieces = [rows] * whole + [(rows * (k + 1)) // parts - (rows * k) // parts
                               for _ in range(items - whole) for k in range(parts)]
    for i, n in enumerate(pieces):
        load[i % threads] += n
    return max(load)


@pytest.mark.parametrize("threads", [2, 3, 4, 5, 8, 12, 16])
def test_tail_split_balances_as_well_as_splitting_every_remainder_item_threads_ways(threads):
    # the split before 2026-11-27 (each of the rest in `threads` ranges) as the bar: never a busier thread
    for items in range(1, 3 * threads):
        for rows in (1, 7, 49, 197, 256):
            whole, parts = fused.tail_split(items, threads, rows)
            rest = items % threads
            old = (items - rest, threads) if rest else (items, 1)
            assert _busiest_rows(items, threads, rows, whole, parts) <= _busiest_rows(items, threads, rows, *old)


@pytest.mark.parametrize("most,outer,threads,want", [(4, 4, 1, 4), (64, 32, 1, 32), (8, 32, 1, 8), (4, 4, 2, 2),
                                                     (4, 3, 2, 2), (4, 1, 2, 1), (1, 8, 1, 1)])
def test_outer_per_item_leaves_no_thread_idle(most, outer, threads, want):
    assert fused.outer_per_item(most, outer, threads) == want


@pytest.mark.parametrize("batch,L,mask", [((4, 4), 16, None), ((5, 3), 9, "float"), ((2, 3, 2), 8, None)])
def test_grouped_items_take_every_head_of_several_batch_items(batch, L, mask, monkeypatch):
    """Whole heads of short sequences on one thread: one softmax call for every head of as many batch items as the
    tile holds (a (B, H) batch; one batch item per call for a batch of more axes), a broadcast mask following."""
    monkeypatch.setattr(fused, "get_threads", lambda: 1)
    inputs = [_x(*batch, L, 8), _x(*batch, L, 8), _x(*batch, L, 4)] + ([_x(L, L)] if mask else [])
    # once before the wrappers: numba types attend_items' group_softmax and the team's attend_items when it
    # compiles them, and a compile with the wrappers in place (a worker's first, the cache cold) fails to type
    check_kernel(make_node("Attention", len(inputs)), inputs, rtol=1e-4, atol=1e-5)
    fused.A.attend_team()
    calls = []
    real, real_items = fused.A.group_softmax, fused.A.attend_items
    monkeypatch.setattr(fused.A, "group_softmax", lambda s, *a: (calls.append(s.shape[:3]), real(s, *a))[1])

    def items(gemm, wide, table, *rest):  # the nogil path: one softmax per item, inside numba
        calls.extend((int(nb), int(nh), int(n)) for _, nb, _, nh, _, n in table)
        return real_items(gemm, wide, table, *rest)
    monkeypatch.setattr(fused.A, "attend_items", items)
    check_kernel(make_node("Attention", len(inputs)), inputs, rtol=1e-4, atol=1e-5)
    runs = [c[:2] for c in calls if c[2]]  # not the build's compile call (no rows)
    assert runs == ([tuple(batch)] if len(batch) == 2 else [(1, batch[-1])] * math.prod(batch[:-1]))


@pytest.mark.parametrize("L,most,want", [(1024, 848, 512), (197, 128, 99), (1500, 128, 125), (100, 128, 100),
                                          (1, 16, 1), (0, 16, 1)])
def test_even_rows_makes_blocks_that_differ_by_at_most_one_row(L, most, want):
    rows = fused.even_rows(L, most)
    assert rows == want and rows <= max(1, most)
    blocks = -(-max(1, L) // rows)
    assert blocks == -(-max(1, L) // most)  # no more blocks than `most` needs
    assert rows * blocks - max(1, L) < blocks  # the last block is short by less than one row a block


@pytest.mark.parametrize("L,S", [(1024, 77), (150, 700)])  # few keys (grouped, query blocks), blocked path
def test_query_blocks_give_both_threads_as_many_rows(L, S, monkeypatch, request):
    """Items interleave over the threads; blocks of the most rows a tile holds plus a short last one gave one
    thread every full block (1024 queries to 77 keys: 848 + 176 rows a head, 4.3 against 1.5 ms of work)."""
    import threading

    monkeypatch.setattr(fused, "get_threads", lambda: 2)
    monkeypatch.setattr(pool, "MIN_WORK", 0)
    monkeypatch.setattr(fused, "GROUP_SPLIT_WORK", 0)
    before = pool.get_threads()
    pool.set_threads(2)
    request.addfinalizer(lambda: pool.set_threads(before))
    rows: dict[int, int] = {}
    lock = threading.Lock()
    for cls in (fused._GroupCall, fused._Call):
        real = cls.item

        def item(self, slot, i, real=real):
            span = self.span(i) if isinstance(self, fused._GroupCall) else None
            n = span[5] if span else min(self.rows, self.L - (i % self.blocks) * self.rows)
            with lock:
                rows[threading.get_native_id()] = rows.get(threading.get_native_id(), 0) + n
            real(self, slot, i)
        monkeypatch.setattr(cls, "item", item)
    q, k, v = _x(1, 4, L, 16), _x(1, 4, S, 16), _x(1, 4, S, 16)
    check_kernel(make_node("Attention", 3), [q, k, v], rtol=1e-4, atol=1e-5)
    counts = sorted(rows.values())
    assert len(counts) == 2 and sum(counts) == 4 * L
    assert counts[1] - counts[0] <= 4  # at most a row per head apart


def _record_spans(monkeypatch, nogil: bool) -> list[tuple[tuple, tuple]]:
    """((path, slot), span) of every item the grouped path computes from now on, on the path asked for: Python's
    items ("items", `_GroupCall.item`) or the nogil path's item tables ("nogil", A.attend_items; the slot named by
    its scores buffer)."""
    monkeypatch.setattr(fused, "NOGIL", nogil)
    seen: list[tuple[tuple, tuple]] = []
    real_item, real_items = fused._GroupCall.item, fused.A.attend_items

    def item(self, slot, i):
        span = self.span(i)
        if span is not None:
            seen.append((("items", id(slot)), span))
        real_item(self, slot, i)

    def items(gemm, wide, table, *rest):
        seen.extend((("nogil", rest[-2].ctypes.data), tuple(int(x) for x in row)) for row in table)
        return real_items(gemm, wide, table, *rest)
    # the team's region function first: numba types its attend_items global when it compiles, and one compiled
    # with the wrapper below in place (a worker's first compile of it, the cache cold) fails to type
    fused.A.attend_team()
    monkeypatch.setattr(fused._GroupCall, "item", item)
    monkeypatch.setattr(fused.A, "attend_items", items)
    return seen


@pytest.mark.parametrize("nogil", [False, True])
@pytest.mark.parametrize("batch,L,mask,causal", [((1, 3), 197, None, False), ((1, 3), 190, "float", False),
                                                 ((2, 5), 40, None, True), ((3,), 1, None, False)])
def test_grouped_tail_items_split_over_the_threads(batch, L, mask, causal, nogil, monkeypatch, request):
    """Short sequences whose items the threads do not divide (3 heads on 2 threads): the remainder runs as query
    ranges, one per thread, so both threads compute as many query rows (a single query: not split); masks and
    causality follow the queries; the output matches the reference. On both paths (Python's items, nogil)."""
    monkeypatch.setattr(fused, "get_threads", lambda: 2)
    monkeypatch.setattr(pool, "MIN_WORK", 0)  # every size split (threads.chunks_for, parallel_for)
    monkeypatch.setattr(fused, "GROUP_SPLIT_WORK", 0)
    before = pool.get_threads()
    pool.set_threads(2)
    request.addfinalizer(lambda: pool.set_threads(before))
    seen = _record_spans(monkeypatch, nogil)
    q, k, v = _x(*batch, L, 16), _x(*batch, L, 16), _x(*batch, L, 8)
    inputs = [q, k, v] + ([_x(L, L)] if mask else [])
    check_kernel(make_node("Attention", len(inputs), params={"is_causal": causal}), inputs, rtol=1e-4, atol=1e-5)
    rows: dict[tuple, int] = {}
    for slot, (_, nb, _, nh, _, n) in seen:
        rows[slot] = rows.get(slot, 0) + nb * nh * n
    counts = sorted(rows.values())
    assert sum(counts) == math.prod(batch) * L
    if L > 1:
        assert len(counts) == 2 and counts[1] - counts[0] <= 1


@pytest.mark.parametrize("nogil", [False, True])
@pytest.mark.parametrize("threads,heads,L", [(12, 16, 40), (5, 3, 197), (8, 3, 33), (3, 7, 2)])
def test_grouped_tail_ranges_cover_every_query_once_on_many_threads(threads, heads, L, nogil, monkeypatch, request):
    """More threads than this machine has: the remainder's ranges (tail_split, fewer than the threads per item)
    cover every query of every head exactly once, and the output matches the reference, masks included."""
    monkeypatch.setattr(fused, "GROUP_SPLIT_WORK", 0)
    monkeypatch.setattr(fused, "GROUP_MAX_THREADS", 64)  # every thread a slot, as before the cap
    monkeypatch.setattr(pool, "MIN_WORK", 0)  # every size split (threads.chunks_for, parallel_for)
    before = pool.get_threads()
    pool.set_threads(threads)
    request.addfinalizer(lambda: pool.set_threads(before))
    seen = _record_spans(monkeypatch, nogil)
    q, k, v = _x(2, heads, L, 16), _x(2, heads, L, 16), _x(2, heads, L, 8)
    for inputs in ([q, k, v], [q, k, v, _x(L, L)]):
        seen.clear()
        check_kernel(make_node("Attention", len(inputs)), inputs, rtol=1e-4, atol=1e-5)
        covered = np.zeros((2, heads, L), np.int64)
        for _, (o0, b, h0, n, l0, rows) in seen:
            covered[o0:o0 + b, h0:h0 + n, l0:l0 + rows] += 1
        assert (covered == 1).all(), np.unique(covered)
        assert any(span[5] < L for _, span in seen)  # a remainder ran as query ranges


@pytest.mark.parametrize("nogil", [False, True])
def test_the_grouped_path_splits_over_at_most_group_max_threads(nogil, monkeypatch, request):
    # Python's items wait for the GIL past a few threads (GROUP_MAX_THREADS); the nogil path keeps the cap, not
    # re-measured on many cores
    monkeypatch.setattr(fused, "GROUP_SPLIT_WORK", 0)
    monkeypatch.setattr(pool, "MIN_WORK", 0)
    before = pool.get_threads()
    pool.set_threads(12)
    request.addfinalizer(lambda: pool.set_threads(before))
    seen = _record_spans(monkeypatch, nogil)
    q, k, v = _x(2, 16, 40, 16), _x(2, 16, 40, 16), _x(2, 16, 40, 8)
    check_kernel(make_node("Attention", 3), [q, k, v], rtol=1e-4, atol=1e-5)
    assert 1 < len({slot for slot, _ in seen}) <= fused.GROUP_MAX_THREADS


@pytest.mark.parametrize("L,S", [(16, 16), (49, 1), (130, 700)])  # grouped (short), one key, blocked (2 blocks)
def test_a_query_whose_scores_are_all_nan_gives_a_nan_row(L, S):
    # every score of query 0 NaN: the max skips NaNs, so the kernel saw "nothing to attend to" and wrote zeros
    q, k, v = _x(1, 2, L, 8), _x(1, 2, S, 8), _x(1, 2, S, 8)
    q[:, :, 0, 0] = np.nan
    mask = _x(L, S)
    for inputs in ([q, k, v], [q, k, v, mask]):
        node = make_node("Attention", len(inputs), params={"scale": None, "is_causal": False})
        got, want = run_kernel(node, inputs)[0], reference(node, inputs)[0]
        assert np.isnan(want[:, :, 0]).all() and not np.isnan(want[:, :, 1:]).any()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("sign", [1, -1])
# flat rows, row-wise rows, blocked (2 query blocks), blocked with key blocks (the online softmax's running max)
@pytest.mark.parametrize("L,S", [(16, 16), (16, 200), (130, 700), (40, 1300)])
def test_a_nan_score_of_either_sign_makes_its_row_nan(L, S, sign):
    """The row max orders the scores' bits: a NaN with its sign bit clear sorts above +inf, one with it set below
    -inf (skipped). Either way the row that holds it comes out NaN and every other row as the reference's."""
    q, k, v = _x(1, 2, L, 8), _x(1, 2, S, 8), _x(1, 2, S, 8)
    nan = np.copysign(np.float32(np.nan), np.float32(sign))
    assert np.signbit(nan) == (sign < 0)
    k[0, 1, S // 2, :] = nan  # every query of head 1 sees it
    node = make_node("Attention", 3)
    got, want = run_kernel(node, [q, k, v])[0], reference(node, [q, k, v])[0]
    assert np.isnan(got[0, 1]).all() and np.isnan(want[0, 1]).all()
    np.testing.assert_allclose(got[0, 0], want[0, 0], rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not onednn.available(), reason="oneDNN is not installed")
@pytest.mark.parametrize("threads", [1, 2])
def test_grouped_gemms_on_onednn_for_mobilevit_256_tokens(threads, monkeypatch):
    """MobileViT-XXS's 256-token attention (heads of 256x256 scores) runs the grouped path's GEMMs on oneDNN, four
    heads a call (a larger tile than numpy's one head), read through the packed (B, T, 3, H, D) strides; its
    64-token attention keeps numpy (oneDNN's per-call cost loses there)."""
    monkeypatch.setattr(fused, "get_threads", lambda: threads)
    runs = _count_runs(monkeypatch)
    g = fused._layout((4, 4, 256, 256), 16, 16, True)
    assert isinstance(g, fused.Grouping) and g.heads == fused.DNN_TILE_BYTES // (4 * 256 * 256) == 4
    assert fused._layout((4, 4, 256, 256), 16, 16, False).heads == 1
    x = _x(4, 256, 3, 4, 16)
    q, k, v = (x[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    node = make_node("Attention", 3)
    kernel, workspace = build_kernel(node, infos_of([q, k, v]))
    out = np.empty((4, 256, 4, 16), np.float32).transpose(0, 2, 1, 3)
    kernel([q, k, v], [out], workspace)
    assert_close(out, reference(node, [q, k, v])[0], 1e-4, 1e-5, "256 tokens")
    assert runs
    runs.clear()
    check_kernel(node, [_x(4, 4, 64, 20) for _ in range(3)], rtol=1e-4, atol=1e-5)
    assert not runs


@pytest.mark.skipif(not onednn.available(), reason="oneDNN is not installed")
@pytest.mark.parametrize("seed", range(24))
def test_grouped_gemms_on_onednn_fuzz(seed, monkeypatch):
    """The grouped path's GEMMs on oneDNN (every size let through) against the reference on random cases: batch
    items and heads, odd sizes, query blocks over few keys, every mask kind with rows that attend to nothing (zeros
    or NaN as the node says), causal, a scale, a NaN score, q/k/v/out read and written through a (B, T, H, D)
    layout's strides, heads shared (broadcast: numpy's way), one or two threads, a smaller run after the max."""
    rng = np.random.default_rng(seed)
    monkeypatch.setattr(fused, "DNN_MIN_SCORES", 1)
    threads = int(rng.integers(1, 3))
    monkeypatch.setattr(fused, "get_threads", lambda: threads)
    runs = _count_runs(monkeypatch)
    b, h = int(rng.integers(1, 4)), int(rng.integers(1, 6))
    L = int(rng.choice([1, 7, 16, 33, 64, 100, 600]))
    S = int(rng.choice([1, 5, 17, 64, 130, 256])) if L < 600 else int(rng.choice([40, 200]))
    e, dv = int(rng.choice([4, 8, 16, 20, 24, 64])), int(rng.choice([4, 16, 24]))
    strided, shared = bool(rng.random() < 0.4), bool(rng.random() < 0.2)
    mask_kind = [None, "bool", "float"][int(rng.integers(0, 3))]
    params = {"is_causal": bool(rng.random() < 0.3), "masked_rows": "nan" if rng.random() < 0.5 else "zero",
              "scale": None if rng.random() < 0.5 else float(rng.choice([0.1, 1.0, -3.0]))}
    if strided:  # (B, T, H, D) as it lies, seen as (B, H, T, D)
        q = _x(b, L, h, e).transpose(0, 2, 1, 3)
        k, v = (_x(b, S, 1 if shared else h, d).transpose(0, 2, 1, 3) for d in (e, dv))
    else:
        q, k, v = _x(b, h, L, e), _x(b, 1 if shared else h, S, e), _x(b, 1 if shared else h, S, dv)
    if rng.random() < 0.3:
        k[0, 0, int(rng.integers(0, S)), 0] = np.nan
    inputs = [q, k, v]
    m = _mask(mask_kind, (b, 1), L, S, dead_rows=(0, L - 1))
    if m is not None:
        inputs.append(m)
    node = make_node("Attention", len(inputs), params=params)
    kernel, workspace = build_kernel(node, infos_of(inputs))
    for sub in (inputs, [a[..., :max(1, a.shape[-2] * 2 // 3), :] if i < 3 else a for i, a in enumerate(inputs)]):
        if len(sub) > 3:  # the mask of the smaller run: its queries and keys
            sub[3] = sub[3][..., :sub[0].shape[-2], :sub[1].shape[-2]]
        out = np.empty((b, sub[0].shape[-2], h, dv), np.float32).transpose(0, 2, 1, 3)
        kernel(sub, [out], workspace)
        assert_close(out, reference(node, sub)[0], 1e-4, 1e-5, f"seed {seed} shapes {[a.shape for a in sub]}")
    assert bool(runs) == (not shared)


@pytest.mark.skipif(fused.numpy_cblas() is None, reason="numpy's BLAS is not an OpenBLAS whose cblas_sgemm is known")
@pytest.mark.parametrize("seed", range(32))
def test_grouped_nogil_path_fuzz(seed, monkeypatch, request):
    """The grouped path without the GIL (A.attend_items, cblas_sgemm from numba) against the reference on random
    cases: 2-D to 4-D operands, batch items and heads, odd sizes, query blocks over few keys, every mask kind
    (float32, float64, bool) with rows that attend to nothing (zeros or NaN as the node says), causal, scales of
    either sign, a NaN score, q/k/v/out through a (B, T, H, D) layout's strides, heads shared (a zero stride), one to
    three threads splitting every size, a smaller run after the max. It must run where the operands suit it (4-D and
    fewer axes), and not on a 5-D batch (Python's items then)."""
    rng = np.random.default_rng(1000 + seed)
    monkeypatch.setattr(fused, "DNN_MIN_SCORES", 1 << 40)  # every size on the nogil path, not oneDNN's
    monkeypatch.setattr(fused, "GROUP_SPLIT_WORK", 0)
    monkeypatch.setattr(pool, "MIN_WORK", 0)
    threads = int(rng.integers(1, 4))
    before = pool.get_threads()
    pool.set_threads(threads)
    request.addfinalizer(lambda: pool.set_threads(before))
    seen = _record_spans(monkeypatch, True)
    rank = int(rng.choice([2, 3, 4, 4, 5]))
    b, h = int(rng.integers(1, 4)), int(rng.integers(1, 6))
    L = int(rng.choice([1, 7, 16, 33, 64, 100, 300]))
    S = int(rng.choice([1, 5, 17, 64, 130, 256]))
    e, dv = int(rng.choice([1, 4, 8, 20, 64])), int(rng.choice([1, 4, 16, 24]))
    strided, shared = rank == 4 and bool(rng.random() < 0.4), rank >= 4 and bool(rng.random() < 0.2)
    mask_kind = [None, "bool", "float", "float64"][int(rng.integers(0, 4))]
    params = {"is_causal": bool(rng.random() < 0.3), "masked_rows": "nan" if rng.random() < 0.5 else "zero",
              "scale": None if rng.random() < 0.5 else float(rng.choice([0.1, 1.0, -3.0]))}
    lead = {2: (), 3: (h,), 4: (b, h), 5: (2, b, h)}[rank]
    if strided:  # (B, T, H, D) as it lies, seen as (B, H, T, D)
        q = _x(b, L, h, e).transpose(0, 2, 1, 3)
        k, v = (_x(b, S, 1 if shared else h, d).transpose(0, 2, 1, 3) for d in (e, dv))
    else:
        kv = lead[:-1] + (1,) if shared else lead
        q, k, v = _x(*lead, L, e), _x(*kv, S, e), _x(*kv, S, dv)
    if rng.random() < 0.3:
        k.reshape(-1, S, e)[0, int(rng.integers(0, S)), 0] = np.nan
    inputs = [q, k, v]
    m = _mask("float" if mask_kind == "float64" else mask_kind, lead[:-1] + (1,) if lead else (), L, S,
              dead_rows=(0, L - 1))
    if m is not None:
        inputs.append(m.astype(np.float64) if mask_kind == "float64" else m)
    node = make_node("Attention", len(inputs), params=params)
    kernel, workspace = build_kernel(node, infos_of(inputs))
    for sub in (inputs, [a[..., :max(1, a.shape[-2] * 2 // 3), :] if i < 3 else a for i, a in enumerate(inputs)]):
        if len(sub) > 3:  # the mask of the smaller run: its queries and keys
            sub[3] = sub[3][..., :sub[0].shape[-2], :sub[1].shape[-2]]
        if strided:
            out = np.empty((b, sub[0].shape[-2], h, dv), np.float32).transpose(0, 2, 1, 3)
        else:
            out = np.empty((*lead, sub[0].shape[-2], dv), np.float32)
        seen.clear()
        kernel(sub, [out], workspace)
        assert_close(out, reference(node, sub)[0], 1e-4, 1e-5, f"seed {seed} shapes {[a.shape for a in sub]}")
        paths = {path for (path, _), _ in seen}
        assert paths == ({"nogil"} if rank <= 4 else {"items"}), (rank, paths, [(a.shape, a.strides) for a in sub])


@pytest.mark.skipif(not onednn.available(), reason="oneDNN is not installed")
def test_grouped_gemm_plans_start_over_past_their_cap(monkeypatch):
    """Query counts that keep changing: past MAX_PLANS the grouped path's plans (and the slots' runners) start over,
    and every run still matches the reference."""
    monkeypatch.setattr(fused, "DNN_MIN_SCORES", 1)
    monkeypatch.setattr(fused._GroupGemms, "MAX_PLANS", 2)
    seen = _spy_prepare(monkeypatch, fused._GroupGemms)
    q, k, v = _x(2, 3, 64, 8), _x(2, 3, 40, 8), _x(2, 3, 40, 8)
    node = make_node("Attention", 3)
    kernel, workspace = build_kernel(node, infos_of([q, k, v]))
    for L in (64, 50, 33, 64, 20, 50):
        inputs = [q[:, :, :L], k, v]
        out = np.empty((2, 3, L, 8), np.float32)
        kernel(inputs, [out], workspace)
        assert_close(out, reference(node, inputs)[0], 1e-4, 1e-5, f"L {L}")
    gemms, slots = seen[-1]
    assert gemms.generation > 0 and len(gemms.plans) <= 2
    for slot in slots:
        if slot.gemms:
            assert all(r[0].plan is gemms.plans[key][0] for key, r in slot.runners.items())


def test_grouped_attention_of_little_work_runs_on_the_calling_thread(monkeypatch, request):
    """Below GROUP_SPLIT_WORK the grouped path hands nothing to the pool (one slot: its items' Python and the
    hand-over would cost more than the split saves); above it, it splits."""
    monkeypatch.setattr(pool, "MIN_WORK", 0)
    before = pool.get_threads()
    pool.set_threads(2)
    request.addfinalizer(lambda: pool.set_threads(before))
    seen = []
    real = fused.parallel_for
    monkeypatch.setattr(fused, "parallel_for", lambda fn, n, work, *a: (seen.append(n), real(fn, n, work, *a))[1])
    inputs = [_x(1, 8, 16, 64), _x(1, 8, 16, 64), _x(1, 8, 16, 64)]  # 262K of work
    check_kernel(make_node("Attention", 3), inputs, rtol=1e-4, atol=1e-5)
    assert seen and set(seen) == {1}
    seen.clear()
    monkeypatch.setattr(fused, "GROUP_SPLIT_WORK", 1 << 10)
    check_kernel(make_node("Attention", 3), inputs, rtol=1e-4, atol=1e-5)
    assert seen and set(seen) == {2}


@pytest.mark.parametrize("mask_kind", [fused.A.MASK_NONE, fused.A.MASK_ADD, fused.A.MASK_BOOL])
@pytest.mark.parametrize("S,scale", [(7, 0.3), (77, 0.125), (fused.A.FLAT_KEYS, -0.5), (fused.A.FLAT_KEYS + 5, 0.2)])
def test_group_softmax_rows_short_and_long(S, scale, mask_kind):
    """group_softmax's two forms (short rows: shifts, one exp pass over the whole tile, sums; longer rows: row by
    row) give exp(scale * s + mask - row max) and the row sums as numpy does, a row with nothing to attend to zeros
    with sum 0, a NaN score a NaN sum; a negative scale takes the unfolded way."""
    L = 9
    s = (RNG.standard_normal((1, 2, L, S)) * 4).astype(np.float32)
    s[0, 1, 2, S // 2] = np.nan
    s[0, 1, 5, 1] = np.copysign(np.float32(np.nan), -1)  # x86's default NaN: the sign bit set
    if mask_kind == fused.A.MASK_ADD:
        mask = np.where(RNG.random((1, 2, L, S)) > 0.3, RNG.standard_normal((1, 2, L, S)), -np.inf).astype(np.float32)
        mask[0, 0, 4], mask[0, 1, 2, S // 2], mask[0, 1, 5, 1] = -np.inf, 0, 0
    elif mask_kind == fused.A.MASK_BOOL:
        mask = RNG.random((1, 2, L, S)) > 0.3
        mask[0, 0, 4], mask[0, 1, 2, S // 2], mask[0, 1, 5, 1] = False, True, True
    else:
        mask = np.zeros((1, 2, L, S), np.float32)
        s[0, 0, 4] = -np.inf * np.sign(scale)  # scaled: -inf
    z = s.astype(np.float64) * scale
    z = z + mask if mask_kind == fused.A.MASK_ADD else np.where(mask, z, -np.inf) if mask_kind == fused.A.MASK_BOOL \
        else z
    with np.errstate(invalid="ignore"):
        m = np.nanmax(np.where(np.isnan(z), -np.inf, z), axis=-1, keepdims=True)
        want = np.where(np.isfinite(m), np.exp(z - np.where(np.isfinite(m), m, 0)), 0.0)
    want_l = want.sum(-1)
    got, l = s.copy(), np.empty((1, 2, L), np.float32)
    given = mask if mask_kind != fused.A.MASK_NONE else np.broadcast_to(fused._NO_MASK[:1, :1], (1, 2, L, 1))
    fused.A.group_softmax(got, given, mask_kind, False, 0, np.float32(scale), l)
    assert np.isnan(l[0, 1, 2]) and np.isnan(want_l[0, 1, 2])
    assert np.isnan(l[0, 1, 5]) and np.isnan(want_l[0, 1, 5])
    assert l[0, 0, 4] == 0 and (got[0, 0, 4] == 0).all()
    ok = ~np.isnan(want_l)  # a NaN row's values are free (its output is NaN through its sum)
    np.testing.assert_allclose(got[ok], want[ok], rtol=2e-6, atol=1e-30)
    np.testing.assert_allclose(l[ok], want_l[ok], rtol=2e-6)


@pytest.mark.parametrize("which", ["k width", "v keys", "out width"])
def test_a_run_whose_shapes_do_not_fit_is_refused_not_read_past(which):
    """BLAS on the nogil path reads what the shapes say: operands that do not fit one another (a kernel called
    directly, past the runtime's checks) go to numpy's matmul, which refuses them."""
    q, k, v = _x(1, 2, 8, 16), _x(1, 2, 8, 16), _x(1, 2, 8, 4)
    node = make_node("Attention", 3)
    kernel, workspace = build_kernel(node, infos_of([q, k, v]))
    out = np.empty((1, 2, 8, 4), np.float32)
    if which == "k width":
        k = _x(1, 2, 8, 8)
    elif which == "v keys":
        v = _x(1, 2, 5, 4)
    else:
        out = np.empty((1, 2, 8, 3), np.float32)
    with pytest.raises(ValueError):
        kernel([q, k, v], [out], workspace)


def test_without_a_known_cblas_the_grouped_path_runs_its_items_from_python(monkeypatch):
    """numpy on another BLAS (MKL, a system OpenBLAS: blas.numpy_cblas finds none): the same results through the
    items dispatched from Python, never the nogil loop."""
    monkeypatch.setattr(fused, "numpy_cblas", lambda: None)
    seen = _record_spans(monkeypatch, True)
    q, k, v = _x(2, 3, 40, 16), _x(2, 3, 40, 16), _x(2, 3, 40, 8)
    for inputs in ([q, k, v], [q, k, v, _mask("bool", (2, 1), 40, 40, dead_rows=(0,))]):
        seen.clear()
        check_kernel(make_node("Attention", len(inputs)), inputs, rtol=1e-4, atol=1e-5)
        assert seen and {path for (path, _), _ in seen} == {"items"}


@pytest.mark.parametrize("case", ["views", "strided_q", "int_mask", "float_mask", "threads"])
def test_a_run_on_the_same_arrays_sees_their_new_contents(case, monkeypatch):
    """The grouped kernel runs its last call again when handed the very same array objects (the runtime's arena
    views): new contents must show in the output every time, also where the call held a copy (a strided q made
    unit-stride, a mask converted to float32: those runs rebuild the call), and a change of thread count rebuilds
    it too."""
    shape = (1, 4, 16, 8)
    q = _x(*shape)
    if case == "strided_q":  # every other float of a wider array: the last axis not unit-stride
        q = np.lib.stride_tricks.as_strided(_x(1, 4, 16, 16), shape, (4 * 16 * 16 * 4, 16 * 16 * 4, 16 * 4, 8))
    k, v = _x(*shape), _x(*shape)
    inputs = [q, k, v]
    if case == "int_mask":
        inputs.append(np.zeros((16, 16), np.int64))
    elif case == "float_mask":
        inputs.append(np.zeros((16, 16), np.float32))
    node = make_node("Attention", len(inputs))
    kernel, workspace = build_kernel(node, infos_of(inputs))
    built = []
    init = fused._GroupCall.__init__
    monkeypatch.setattr(fused._GroupCall, "__init__", lambda self, *a: (built.append(1), init(self, *a))[1])
    out = np.empty(shape, np.float32)
    for step in range(4):
        q[...], k[...], v[...] = _x(*shape), _x(*shape), _x(*shape)
        if len(inputs) > 3:
            inputs[3][...] = RNG.integers(-3, 1, (16, 16)) if case == "int_mask" else _x(16, 16)
        if case == "threads":
            monkeypatch.setattr(pool, "_threads", 1 + step % 2)
        calls = len(built)
        kernel(inputs, [out], workspace)
        assert_close(out, reference(node, inputs)[0], rtol=1e-4, atol=1e-5)
        rebuilt = len(built) > calls
        assert rebuilt == (step == 0 or case in ("strided_q", "int_mask", "threads")), (step, rebuilt)
