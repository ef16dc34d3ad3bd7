"""Scaled dot-product attention: softmax(q·kᵀ·scale + mask)·v over (…, L, E) tensors, torch semantics.

A bool mask means "may attend"; a float mask is added to the scores; is_causal keeps the lower triangle
(top-left aligned, as torch). A row with nothing to attend to gives zeros, as torch's
scaled_dot_product_attention does, or NaN with masked_rows="nan", as torch's nn.MultiheadAttention and an explicit
softmax(q·kᵀ)·v give it (the softmax of a row of -inf)."""

from __future__ import annotations

import math

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import broadcast, float_of


def shapes(node: Node, ins: list[TensorInfo]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(scores shape, output shape); ShapeError when q, k, v and mask do not fit."""
    if len(ins) not in (3, 4):
        raise ShapeError(f"{node.where()}: Attention takes q, k, v, [mask], got {len(ins)} inputs")
    q, k, v = (i.shape for i in ins[:3])
    if min(len(q), len(k), len(v)) < 2 or q[-1] != k[-1] or k[-2] != v[-2]:
        raise ShapeError(f"{node.where()}: Attention shapes q {q}, k {k}, v {v} do not fit (…, L, E)/(…, S, E)")
    batch = broadcast(node, [q[:-2], k[:-2], v[:-2]])
    scores = batch + (q[-2], k[-2])
    if len(ins) == 4:
        full = broadcast(node, [scores, ins[3].shape])
        if full != scores:
            raise ShapeError(f"{node.where()}: Attention mask {ins[3].shape} does not broadcast to scores {scores}")
    return scores, batch + (q[-2], v[-1])


def scale(node: Node, e: int) -> float:
    s = node.params.get("scale")
    return 1.0 / math.sqrt(e) if s is None else float(s)


def nan_rows(node: Node) -> bool:
    """Whether a row with nothing to attend to is NaN (masked_rows="nan") rather than zeros (the default)."""
    mode = node.params.get("masked_rows") or "zero"
    if mode not in ("zero", "nan"):
        raise ShapeError(f"{node.where()}: Attention masked_rows must be 'zero' or 'nan', got {mode!r}")
    return mode == "nan"


def _infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    _, out = shapes(node, ins)
    nan_rows(node)
    return [TensorInfo(out, float_of(ins[0].dtype))]


def masked_fill(scores: np.ndarray, mask: np.ndarray | None, blocked: np.ndarray | None) -> None:
    """Adds a float mask, then sets what a bool mask or causality (`blocked`, True above the diagonal) forbids
    to -inf, in place."""
    if mask is not None:
        if mask.dtype == np.bool_:
            np.copyto(scores, -np.inf, where=np.logical_not(mask))
        else:
            scores += mask
    if blocked is not None:
        L, S = scores.shape[-2:]
        np.copyto(scores, -np.inf, where=blocked[:L, :S])


def causal_block(L: int, S: int) -> np.ndarray:
    """True where torch's is_causal forbids attending (j > i); a max-size block serves every smaller (L, S)."""
    return ~np.tri(L, S, dtype=bool)


def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    q, k, v = (np.asarray(a) for a in arrays[:3])
    ot = float_of(q.dtype)
    mask = np.asarray(arrays[3]) if len(arrays) > 3 else None
    scores = np.matmul(q.astype(np.float64), np.swapaxes(k.astype(np.float64), -1, -2)) * scale(node, q.shape[-1])
    causal = bool(node.params.get("is_causal", False))
    masked_fill(scores, None if mask is None else mask if mask.dtype == np.bool_ else mask.astype(np.float64),
                causal_block(*scores.shape[-2:]) if causal else None)
    m = np.max(scores, axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(m), m, 0))
    total = np.sum(e, axis=-1, keepdims=True)
    # a row with every score masked sums to 0 (nan_rows says what it gives); a NaN score makes its row NaN
    p = np.divide(e, total, out=np.full_like(e, np.nan if nan_rows(node) else 0.0), where=total != 0)
    return [np.matmul(p, v.astype(np.float64)).astype(ot)]


register(OpDef("Attention", _infer, reference, arity=(3, 4), float_inputs=(0, 1, 2)))
