"""Weights and biases to int8 / int32 as TNN's quantization tool does (calibration.cc, MIN_MAX):

- a convolution's float weights are multiplied by their input blob's scale per input channel first (so the int8
  product of weight and activation is the real product over the weight scale alone); a depthwise one's are not,
  its weight scale is multiplied by the input scale instead;
- per output channel (or once for the tensor), scale = max|w| / 127, w_q = round(w / scale) clamped to +-127
  (std::round: half away from zero), in float32 as TNN;
- the bias becomes int32(bias / scale), truncated as C++'s cast does; 0 where the scale is 0.
Inner products take a per-tensor input scale (TNN merges their input blob).
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def round_away(v: np.ndarray) -> np.ndarray:
    """std::round on float32 values (exact: float64 holds v + 0.5)."""
    v = np.asarray(v, np.float64)
    return np.where(v >= 0, np.floor(v + 0.5), np.ceil(v - 0.5))


def _quantize_rows(w: np.ndarray, per_channel: bool) -> tuple[np.ndarray, np.ndarray]:
    """(int8 rows, float32 scale per row) of a 2-D float32 array, TNN's MIN_MAX."""
    rows = w if per_channel else w.reshape(1, -1)
    max_abs = np.abs(rows).max(axis=1).astype(F32)
    scale = (max_abs / F32(127.0)).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(max_abs != 0, F32(1.0) / scale, F32(1.0)).astype(F32)
    q = np.clip(round_away((rows * inv[:, None]).astype(F32)), -127, 127).astype(np.int8)
    q = q.reshape(w.shape)
    return q, (scale if per_channel else np.broadcast_to(scale, (w.shape[0],)).astype(F32))


def quantize_bias(bias: np.ndarray | None, scale: np.ndarray) -> np.ndarray:
    if bias is None:
        return np.zeros(scale.size, np.int32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale != 0, np.trunc((np.asarray(bias, F32) / scale).astype(F32)), 0)
    return np.clip(q, -2 ** 31, 2 ** 31 - 1).astype(np.int32)


def quantize_conv(weight: np.ndarray, bias: np.ndarray | None, in_scale: np.ndarray, groups: int,
                  per_channel: bool = True, in_mean: np.ndarray | None = None) \
        -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int8 weight (O, I/g, kh, kw), int32 bias, float32 weight scale (O,)) of a float conv. With `in_mean` (the
    input's mean per channel), the bias also takes back the mean shift the weights' rounding causes."""
    w0 = np.asarray(weight, F32)
    o, icg = w0.shape[:2]
    c = icg * groups
    s_in = np.broadcast_to(np.asarray(in_scale, F32).reshape(-1), (c,)) if np.size(in_scale) in (1, c) else None
    if s_in is None:
        raise ValueError(f"{np.size(in_scale)} input scales for {c} channels")
    depthwise = icg == 1 and o == groups
    ic = (np.arange(o) // (o // groups))[:, None] * icg + np.arange(icg)[None, :]  # w[o, i] reads channel ic
    w = w0 if depthwise else (w0 * s_in[ic][:, :, None, None]).astype(F32)
    q, scale = _quantize_rows(w.reshape(o, -1), per_channel)
    q = q.reshape(w.shape)
    if depthwise:
        scale = (scale * s_in).astype(F32)
    if in_mean is not None and bias is not None:
        bias = corrected_bias(w0, q, scale, s_in[ic], bias, np.asarray(in_mean, np.float64)[ic])
    return q, quantize_bias(bias, scale), scale


def corrected_bias(w: np.ndarray, q: np.ndarray, scale: np.ndarray, s_in: np.ndarray, bias: np.ndarray,
                   mean: np.ndarray) -> np.ndarray:
    """bias - (W_q - W) . E[x] (bias correction, Nagel et al. 2019): the int8 weights W_q = q * scale / s_in
    shift every output's mean by the first term; s_in and mean are per (output, input) pair (O, I/g)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        wq = q.astype(np.float64) * scale.astype(np.float64).reshape(-1, 1, 1, 1) / \
            s_in.astype(np.float64)[:, :, None, None]
    err = np.where(np.isfinite(wq), wq, 0.0) - w.astype(np.float64)
    shift = (err.sum(axis=(2, 3)) * mean).sum(axis=1)
    return (np.asarray(bias, np.float64) - shift).astype(F32)


def quantize_inner_product(weight: np.ndarray, bias: np.ndarray | None, in_scale: np.ndarray,
                           per_channel: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int8 weight (O, K), int32 bias, float32 weight scale (O,)) of a float inner product."""
    s = np.asarray(in_scale, F32).reshape(-1)
    if s.size != 1:
        raise ValueError(f"an inner product's input takes one scale, got {s.size}")
    w = (np.asarray(weight, F32) * s[0]).astype(F32)
    q, scale = _quantize_rows(w, per_channel)
    return q, quantize_bias(bias, scale), scale
