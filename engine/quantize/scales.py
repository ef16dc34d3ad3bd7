"""Blob scales from calibration statistics, by TNN's formulas (tools/quantization/scale_calculator.cc).

Each blob channel (or the whole blob, merged) keeps the largest |x| seen and a 2048-bin histogram of |x| over
[0, max] (zeros not counted). Its threshold bin t gives the scale (t + 0.5) / interval / 127 with
interval = 2048 / max, so that 127 * scale covers the chosen range:
- `minmax`: t = 2047, the whole range;
- `kl`: the t in [128, 2048) whose 128-level quantization of the clipped histogram is nearest in KL divergence
  (TNN's search, step for step);
- `percentile`: the first bin where the cumulative share reaches the percentile (not in TNN's tool).
TNN takes min-max for the model's input blobs and for maps with fewer than 100 pixels; a channel whose max is
below 1e-5 gets scale 0 (TNN's int8 kernels then write 0 there).
"""

from __future__ import annotations

import numpy as np
from numba import njit

BINS = 2048
TARGET_BINS = 128
MIN_VALID = 1e-5
METHODS = ("minmax", "kl", "percentile")


def interval(max_abs: np.ndarray) -> np.ndarray:
    """TNN's bins per unit, float32 (0 for an invalid channel)."""
    m = np.asarray(max_abs, np.float32)
    with np.errstate(divide="ignore"):
        return np.where(m > MIN_VALID, np.float32(BINS) / m, np.float32(0)).astype(np.float32)


def scale_from_threshold(threshold: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """((threshold + 0.5) / interval / 127.0) in double, stored as float, as TNN; 0 for invalid channels."""
    t = np.asarray(threshold, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = (t + 0.5) / inv.astype(np.float64) / 127.0
    return np.where(inv > 0, s, 0.0).astype(np.float32)


def minmax_scales(max_abs: np.ndarray) -> np.ndarray:
    inv = interval(max_abs)
    return scale_from_threshold(np.full(inv.shape, BINS - 1), inv)


def percentile_scales(hist: np.ndarray, max_abs: np.ndarray, percentile: float) -> np.ndarray:
    """hist: (channels, BINS) counts."""
    inv = interval(max_abs)
    total = hist.sum(axis=1, keepdims=True)
    cum = np.cumsum(hist, axis=1) / np.maximum(total, 1)
    t = np.argmax(cum >= percentile / 100.0, axis=1)
    t = np.where(total[:, 0] > 0, t, BINS - 1)
    return scale_from_threshold(t, inv)


def kl_scales(hist: np.ndarray, max_abs: np.ndarray) -> np.ndarray:
    inv = interval(max_abs)
    t = np.array([kl_threshold(h.astype(np.float32)) for h in hist], np.int64)
    return scale_from_threshold(t, inv)


@njit(cache=True, nogil=True)
def kl_threshold(counts):
    """TNN's CalculateScalePerDis for KL_DIVERGENCE on one histogram (float32 math, as TNN's)."""
    n = counts.shape[0]
    dist = counts + np.float32(1e-7)  # TNN fills every bin with 1e-7 before counting
    dist = dist / dist.sum()
    after = np.float32(0.0)
    for i in range(TARGET_BINS, n):
        after += dist[i]
    best, threshold = np.float32(1e6), TARGET_BINS
    for i in range(TARGET_BINS, n):
        ref = dist[:i].copy()
        ref[i - 1] += after
        after -= dist[i]
        quant = np.zeros(TARGET_BINS, np.float32)
        width = np.float32(i) / np.float32(TARGET_BINS)
        for j in range(TARGET_BINS):
            start = j * width
            end = start + width
            left = int(np.ceil(start))
            if left > start:
                quant[j] += (left - start) * dist[left - 1]
            right = int(np.floor(end))
            if right < end:
                quant[j] += (end - right) * dist[right]
            for k in range(left, right):
                quant[j] += dist[k]
        expanded = np.zeros(i, np.float32)
        for j in range(TARGET_BINS):
            start = j * width
            end = start + width
            left = int(np.ceil(start))
            right = int(np.floor(end))
            count = np.float32(0.0)
            lscale = np.float32(0.0)
            if left > start:
                lscale = left - start
                if dist[left - 1] != 0:
                    count += lscale
            rscale = np.float32(0.0)
            if right < end:
                rscale = end - right
                if dist[right] != 0:
                    count += rscale
            for k in range(left, right):
                if dist[k] != 0:
                    count += 1
            if count == 0:
                continue
            each = quant[j] / count
            if left > start and dist[left - 1] != 0:
                expanded[left - 1] += each * lscale
            if right < end and dist[right] != 0:
                expanded[right] += each * rscale
            for k in range(left, right):
                if dist[k] != 0:
                    expanded[k] += each
        kl = np.float32(0.0)
        for k in range(i):
            if ref[k] != 0:
                kl += np.float32(1.0) if expanded[k] == 0 else ref[k] * np.log(ref[k] / expanded[k])
        if kl < best:
            best, threshold = kl, i
    return threshold
