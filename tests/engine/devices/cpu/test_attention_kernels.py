"""Attention's CPU kernel vs the reference, with its workspace (and without), float16 through the reference."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import build_kernel, check_kernel, get_op, infos_of, kernel_peak_bytes, kernel_workspace, make_node

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


def test_workspace_holds_the_scores():
    q, k, v = _x(2, 4, 6, 8), _x(2, 4, 10, 8), _x(2, 4, 10, 8)
    node = make_node("Attention", 3)
    assert kernel_workspace(node, infos_of([q, k, v])) == 2 * 4 * 6 * 10 * 4


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
